"""Where a benchmark request's time goes: vLLM's per-request engine timestamps split into
phases, and an optional ``py-spy`` capture of one phase (the GPU benchmarks use both)."""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import time
from pathlib import Path
from typing import Any, Callable

PHASES = ("front_ms", "queue_ms", "engine_ms", "return_ms")
#: vlmcache's own share of the front and return phases, where a benchmark measured it
OURS = ("ours_front_ms", "ours_return_ms")


def median_ms(fn: Callable[[], object], repeats: int) -> float:
    """The median of ``repeats`` timings of ``fn()`` in ms (this machine's other load only
    adds to a timing)."""
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append((time.perf_counter() - started) * 1000)
    return round(statistics.median(times), 3)


def phases(out: Any, start: float, end: float) -> dict[str, float]:
    """Where one request's time went, from vLLM's engine timestamps (monotonic, like
    ``perf_counter`` on Linux): call -> engine core received it (input processing, IPC),
    -> scheduled, -> last token, -> back to the caller."""
    m = getattr(out, "metrics", None)
    queued, sched = getattr(m, "queued_ts", 0.0), getattr(m, "scheduled_ts", 0.0)
    last = getattr(m, "last_token_ts", 0.0)
    if not (start < queued <= sched <= last <= end):
        return {}
    return {"front_ms": (queued - start) * 1e3, "queue_ms": (sched - queued) * 1e3,
            "engine_ms": (last - sched) * 1e3, "return_ms": (end - last) * 1e3}


def phase_medians(facts: list[dict[str, Any]]) -> dict[str, float]:
    timed = [f for f in facts if "front_ms" in f]
    if not timed:
        return {}
    return {f"{k[:-3]}_median_ms": round(statistics.median(f[k] for f in timed), 2)
            for k in PHASES + OURS if k in timed[0]}


class PhaseProfile:
    """``py-spy record`` of this process and its children (the EngineCore, the I/O
    process) over one phase, as collapsed stacks, when ``--profile-dir`` is given and
    ``py-spy`` is on PATH (``--profile-phases``: only those; ``--profile-native``: with C
    frames, at a lower rate: unwinding them is slow)."""

    def __init__(self, args: argparse.Namespace, name: str, phase: str = "") -> None:
        wanted = not args.profile_phases or phase in args.profile_phases.split(",")
        self.native = bool(args.profile_native)
        self.path = (Path(args.profile_dir) / f"{name}.txt"
                     if args.profile_dir and wanted else None)
        self.proc: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> "PhaseProfile":
        import shutil

        exe = shutil.which("py-spy")
        if self.path is None or exe is None:
            return self
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # py-spy unwinds C frames only from a stopped process: --native samples block
        how = ["--native", "--rate", "100"] if self.native else ["--nonblocking", "--rate", "500"]
        with open(self.path.with_suffix(".err"), "wb") as err:  # why a profile is missing
            self.proc = subprocess.Popen(
                [exe, "record", "--pid", str(os.getpid()), "--subprocesses", "--idle",
                 "--threads", *how, "--format", "raw", "-o", str(self.path)],
                stdout=subprocess.DEVNULL, stderr=err)
        time.sleep(1.0)  # attached before the phase starts
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is None:
            return
        import signal

        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
