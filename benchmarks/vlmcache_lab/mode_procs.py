"""Each mode of the GPU benchmark in a process group of its own, and what is left of it
(engines holding the GPU, the persistent tier's detached I/O process writing out) ended
before the next mode starts, also when the benchmark itself is cut off."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from vlmcache_lab import child_env

HASH_ENV = {"PYTHONHASHSEED": "0"}  # vLLM's block hashes reproducible across restarts
#: ``MODE@variant`` run with these in its environment (read when its processes start):
#: vLLM's KV dimension order forced, or CPython's small-object allocator off
VARIANT_ENV = {"nhd": {"VLLM_KV_CACHE_LAYOUT": "NHD"}, "hnd": {"VLLM_KV_CACHE_LAYOUT": "HND"},
               "malloc": {"PYTHONMALLOC": "malloc"}}
#: what a mode's process runs (its mode and arguments follow)
CHILD_CMD = (sys.executable, "-m", "vlmcache_lab.gpu_native_path")
#: the end of a finished mode's log kept beside its result (``MODE.log`` in ``--work``)
LOG_KEEP_CHARS = 400_000


def run_group(modes: list[str], args: argparse.Namespace,
              forwarded: list[str]) -> dict[str, dict[str, Any]]:
    """Modes in processes of their own, at once; with more than one they take turns on the
    GPU through a :class:`~vlmcache_lab.turns.TurnServer` and share its memory equally.
    What is left of each (its I/O process writing out) is ended once all are done: an I/O
    process looks like any other, and one mode's clean-up must not kill another's."""
    server, extra = None, []
    if len(modes) > 1:
        from vlmcache_lab.turns import TurnServer

        sock = Path(args.work) / f"turns-{os.getpid()}-{'+'.join(modes)}.sock"
        sock.unlink(missing_ok=True)
        server = TurnServer(str(sock), len(modes))
        share = args.gpu_memory_utilization / len(modes)
        extra = ["--turns", str(sock), "--gpu-memory-utilization", f"{share:.3f}"]
    cores = cpu_slices(len(modes)) if args.pin_cpus else [None] * len(modes)
    started = {m: _start(m, args, forwarded + extra, c) for m, c in zip(modes, cores)}
    logs: dict[str, str | None] = {}
    threads = [threading.Thread(target=_wait, args=(m, p, args.mode_timeout, logs, server))
               for m, (p, _, _) in started.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    flushed = time.time()
    for proc, _, _ in started.values():
        _end_group(proc, args.flush_timeout)
    if server is not None:
        server.close()
        sock.unlink(missing_ok=True)
    results = {m: _result(m, started[m], logs[m], args, flushed) for m in modes}
    if server is not None:
        for r in results.values():
            r["interleaved_with"] = [m for m in modes]
            r["turns"] = server.turns
    return results


def cpu_slices(n: int) -> list[set[int] | None]:
    """``n`` disjoint sets of this process's CPUs, one per mode taking turns (``--pin-cpus``):
    each mode's processes (its engine's, its I/O process) then run on cores of their own.
    ``None`` for every mode when there are fewer CPUs than modes."""
    cpus = sorted(os.sched_getaffinity(0))
    size = len(cpus) // n
    if size == 0:
        return [None] * n
    return [set(cpus[i * size:(i + 1) * size]) for i in range(n)]


def _start(mode: str, args: argparse.Namespace, forwarded: list[str],
           cpus: set[int] | None = None) -> tuple[subprocess.Popen[str], Path, float]:
    out = Path(args.work) / f"{mode}.json"
    out.unlink(missing_ok=True)
    cmd = [*CHILD_CMD, "--child", mode, "--child-out", str(out), *forwarded]
    variant = mode.partition("#")[0].partition("@")[2]
    env = {**child_env(), **HASH_ENV, **VARIANT_ENV.get(variant, {})}
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    # its own session: a timed-out mode's engine processes (which hold the GPU) die with it
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True, preexec_fn=pin)
    _RUNNING.append(proc)
    return proc, out, time.time()


def _wait(mode: str, proc: subprocess.Popen[str], timeout: float,
          logs: dict[str, str | None], server: Any) -> None:
    try:
        logs[mode], _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill(proc.pid, os.killpg)
        proc.communicate()
        logs[mode] = None
    finally:
        _RUNNING.remove(proc)
        if server is not None:
            server.ended(mode)


def _result(mode: str, started: tuple[subprocess.Popen[str], Path, float], log: str | None,
            args: argparse.Namespace, flushed: float) -> dict[str, Any]:
    proc, out, start = started
    if log is None:
        return {"error": f"timed out after {args.mode_timeout} s"}
    # the engine's own log lines (vLLM's and vlmcache's), for diagnosis
    out.with_suffix(".log").write_text(log[-LOG_KEEP_CHARS:])
    if proc.returncode != 0 or not out.exists():
        return {"error": f"exit {proc.returncode}", "log_tail": log[-3000:]}
    result = json.loads(out.read_text())
    result["process_s"] = round(flushed - start, 1)
    result["flush_s"] = round(time.time() - flushed, 1)  # its I/O process writing out
    return result


def _io_processes() -> list[int]:
    """The pids of vlmcache KV I/O processes on this machine (zombies excluded)."""
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            cmd = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if b"vlmcache.vllm.io_worker" in cmd and state != "Z":
            pids.append(int(entry.name))
    return pids


def _kill(pid: int, how: Any) -> None:
    try:
        how(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


#: the mode running now (its process group outlives this process unless killed)
_RUNNING: list[subprocess.Popen[str]] = []


def kill_running(signum: int, _frame: Any) -> None:
    """SIGTERM/SIGINT (a device call's time limit): a mode's engines, in their own session,
    would hold the GPU after this process ends; the next run would find it full."""
    for proc in list(_RUNNING):
        _kill(proc.pid, os.killpg)
    raise SystemExit(128 + signum)


def _end_group(proc: subprocess.Popen[str], flush_s: float) -> None:
    """Let a finished mode's remaining processes (the persistent tier's I/O process writing
    its queue out after the engine stopped; it leaves the engine's process tree) end by
    themselves for up to ``flush_s``, then kill them: the next mode gets the GPU and the
    store as the last one left them."""
    deadline = time.monotonic() + flush_s
    while time.monotonic() < deadline:
        try:
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            if not _io_processes():
                break
        time.sleep(0.5)
    for pid in _io_processes():
        _kill(pid, os.kill)
    _kill(proc.pid, os.killpg)
    proc.communicate()
    time.sleep(2.0)  # the driver frees a killed engine's GPU memory
