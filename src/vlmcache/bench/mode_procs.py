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
import time
from pathlib import Path
from typing import Any

HASH_ENV = {"PYTHONHASHSEED": "0"}  # vLLM's block hashes reproducible across restarts


def run_child(mode: str, args: argparse.Namespace, forwarded: list[str]) -> dict[str, Any]:
    out = Path(args.work) / f"{mode}.json"
    cmd = [sys.executable, "-m", "vlmcache.bench.gpu_native_path", "--child", mode,
           "--child-out", str(out), *forwarded]
    env = {**os.environ, **HASH_ENV}
    start = time.time()
    # its own session: a timed-out mode's engine processes (which hold the GPU) die with it
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    _RUNNING.append(proc)
    try:
        log, _ = proc.communicate(timeout=args.mode_timeout)
    except subprocess.TimeoutExpired:
        _end_group(proc, 0.0)
        return {"error": f"timed out after {args.mode_timeout} s"}
    finally:
        _RUNNING.remove(proc)
    flushed = time.time()
    _end_group(proc, args.flush_timeout)
    if proc.returncode != 0 or not out.exists():
        return {"error": f"exit {proc.returncode}", "log_tail": (log or "")[-3000:]}
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
