"""A real ``redis-server`` subprocess on a free loopback port, for tests and fault benchmarks.

It can be killed (SIGKILL), restarted on the same port, and paused (SIGSTOP: a hung
server that accepts connections but never answers). Persistence is off, so a restart is
an empty Redis, as after a crash without AOF.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path


def redis_server_path() -> str | None:
    """The ``redis-server`` executable, or ``None`` when it is not installed."""
    return shutil.which("redis-server")


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """One ``redis-server`` on 127.0.0.1 (``maxmemory`` with ``volatile-lru``, no persistence)."""

    def __init__(self, maxmemory: str = "256mb", port: int | None = None,
                 tls: tuple[Path, Path, Path] | None = None) -> None:
        """``tls``: (certificate, key, CA) files: serve TLS only, on ``port``."""
        exe = redis_server_path()
        if exe is None:
            raise RuntimeError("redis-server is not installed (Debian: apt-get install "
                               "redis-server; scripts/setup.sh does it when run as root)")
        self.exe = exe
        self.port = port or free_port()
        self.maxmemory = maxmemory
        self.tls = tls
        self.workdir = Path(tempfile.mkdtemp(prefix="vlmcache-redis-"))
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls else 'redis'}://127.0.0.1:{self.port}/0"

    def start(self, timeout_s: float = 10.0) -> None:
        """Start (or restart) the server and wait until it answers PING."""
        if self.proc is not None and self.proc.poll() is None:
            return
        ports = ["--port", str(self.port)]
        if self.tls:
            cert, key, ca = self.tls
            ports = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(cert),
                     "--tls-key-file", str(key), "--tls-ca-cert-file", str(ca),
                     "--tls-auth-clients", "no"]
        args = [self.exe, *ports, "--bind", "127.0.0.1",
                "--save", "", "--appendonly", "no", "--dir", str(self.workdir),
                "--maxmemory", self.maxmemory, "--maxmemory-policy", "volatile-lru",
                "--protected-mode", "yes", "--loglevel", "warning"]
        self.proc = subprocess.Popen(args, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._ping():
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}")
            time.sleep(0.02)
        raise RuntimeError(f"redis-server did not answer on port {self.port}")

    def kill(self) -> None:
        """SIGKILL the server (as a crash) and wait for it to be gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.resume()
            self.proc.kill()
            self.proc.wait(timeout=10)

    def pause(self) -> None:
        """SIGSTOP: the server keeps its socket but answers nothing."""
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self) -> None:
        """Stop the server and remove its work directory."""
        if self.proc is not None and self.proc.poll() is None:
            self.resume()
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)
        shutil.rmtree(self.workdir, ignore_errors=True)

    def client(self) -> object:
        """A plain redis-py client (generous timeouts) for test set-up and inspection."""
        import redis

        return redis.Redis.from_url(self.url, socket_timeout=5.0)

    def _ping(self) -> bool:
        if self.tls:
            return self._ping_tls()
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def _ping_tls(self) -> bool:
        import ssl

        ctx = ssl.create_default_context(cafile=str(self.tls[2]))  # type: ignore[index]
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as raw:
                with ctx.wrap_socket(raw, server_hostname="127.0.0.1") as s:
                    s.sendall(b"PING\r\n")
                    return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False


def make_test_certificates(directory: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA and a server certificate for 127.0.0.1 (needs the ``openssl`` tool)."""
    d = Path(directory)
    ca_key, ca, key, csr, cert = (d / n for n in ("ca.key", "ca.crt", "server.key",
                                                  "server.csr", "server.crt"))
    ext = d / "san.ext"
    ext.write_text("subjectAltName=IP:127.0.0.1\n")
    run = lambda *a: subprocess.run(["openssl", *a], check=True, capture_output=True)  # noqa
    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out",
        str(ca), "-days", "2", "-subj", "/CN=vlmcache-test-ca")
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
        "-subj", "/CN=127.0.0.1")
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))
    return cert, key, ca
