"""Local-store fault kinds -> ``benchmarks/results/reliability.json``.

The file is shared with the Redis fault kinds and the two-replica run (written by other
scripts): :func:`merge` replaces only the entries it is given, under a file lock, and
writes atomically.
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from vlmcache_lab import fault_inputs, fault_procs, faults
from vlmcache_lab.faults import FaultResult


def device() -> str:
    return (f"{platform.node()}: {os.cpu_count()} CPU cores, {platform.platform()}, "
            "local disk, no GPU")


def trials_plan(trials: int) -> list[Callable[[], FaultResult]]:
    """Every local fault kind at ``trials`` trials (process-heavy kinds at fewer)."""
    few = max(1, trials // 5)
    return [
        lambda: faults.corrupt_chunk(trials),
        lambda: faults.truncated_chunk(trials),
        lambda: faults.corrupt_manifest(trials),
        lambda: faults.disk_full(trials),
        lambda: fault_procs.kill9_writes(few, "sync"),
        lambda: fault_procs.kill9_writes(few, "async"),
        lambda: fault_procs.four_processes(max(1, few // 2)),
        lambda: fault_inputs.hostile_names(max(1, trials // 10)),
        lambda: fault_inputs.lone_surrogate_tenant(1),
        lambda: fault_inputs.planted_symlinks(trials),
    ]


def merge(out: Path, entries: dict[str, dict[str, object]], command: str) -> None:
    """Put ``entries`` into ``out``'s ``faults`` by kind, keeping every other key and kind."""
    out.parent.mkdir(parents=True, exist_ok=True)
    lock_path = Path(tempfile.gettempdir()) / "vlmcache-reliability-json.lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(out.read_text()) if out.is_file() else {}
        kinds = data.get("faults")
        if isinstance(kinds, list):  # an older layout: a list of entries with "kind"
            kinds = {str(e.get("kind")): e for e in kinds if isinstance(e, dict)}
        data["faults"] = {**(kinds or {}), **entries}
        data.setdefault("command", command)
        data.setdefault("device", device())
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        os.replace(tmp, out)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=50)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/reliability.json"))
    args = ap.parse_args(argv)
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    entries: dict[str, dict[str, object]] = {}
    for trial in trials_plan(args.trials):
        started = time.perf_counter()
        result = trial()
        entry = {"kind": result.kind, **result.as_json(), "command": command,
                 "device": device(), "wall_s": round(time.perf_counter() - started, 1)}
        entries[result.kind] = entry
        print(json.dumps(entry, ensure_ascii=False)[:400], flush=True)
    merge(args.out, entries, command)
