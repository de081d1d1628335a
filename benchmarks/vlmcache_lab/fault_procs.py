"""Fault trials that need processes: kill -9 during writes, four processes on one store.

Children run this module (``python -m vlmcache_lab.fault_procs writer|mixer ...``) and
report on stdout; the parent injects the fault and checks what the store serves afterwards.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import time
from pathlib import Path

from vlmcache_lab.faults import (
    CHUNK_NUMEL, FaultResult, captured, chunk_for, key_of, keys, read_back, repeat, same,
    scratch,
)
from vlmcache.store.chunkfile import file_entry
from vlmcache.store.disk import DiskStore
from vlmcache.store.memory import MemoryStore
from vlmcache.store.tiered import TieredStore
from vlmcache_lab import child_env

CHUNK_BYTES = CHUNK_NUMEL * 2


def kill9_writes(trials: int, mode: str, seed: int = 4) -> FaultResult:
    """A writer process killed with SIGKILL mid-stream; every key it was told was kept is
    then read back from disk. ``mode``: ``sync`` (put returns after the file is renamed into
    place) or ``async`` (the default write-behind: put returns once queued in memory)."""
    res = FaultResult(f"kill9_{mode}_writes",
                      method=f"SIGKILL a writer process ({mode} disk writes) 0.3-1.5 s after "
                             "its first acknowledged put; read back every acknowledged key; "
                             "unlogged: lost keys the next start's journal report left out")
    rng = random.Random(seed)
    return repeat(res, trials, lambda _: _kill_trial(res, rng, mode))


def _kill_trial(res: FaultResult, rng: random.Random, mode: str) -> None:
    with scratch() as root, captured() as log:
        prefix = rng.randrange(1 << 16)
        child = subprocess.Popen(
            [sys.executable, "-m", __name__, "writer", str(root), mode, str(prefix)],
            stdout=subprocess.PIPE, text=True, env=child_env())
        assert child.stdout is not None
        acked = [child.stdout.readline().strip()]  # blocks until the first put returned
        time.sleep(rng.uniform(0.3, 1.5))
        child.kill()
        child.wait()
        acked += [line.strip() for line in child.stdout if line.strip()]
        acked = [k for k in acked if k]
        # the next start on the store: its write-behind claims the dead writer's journal
        restarted = TieredStore(MemoryStore(1 << 20), DiskStore(root / "kv", 1 << 34),
                                write_behind_bytes=1 << 20)
        assert restarted.writer is not None
        reported = set(restarted.writer.crash_loss.keys)
        restarted.close()
        disk = DiskStore(root / "kv", 1 << 34)
        missing = {k for k in acked if not disk.contains(k)}
        read_back(res, disk, acked, log, set(acked))
        # a loss the restart did not report is an unlogged loss
        res.unlogged_losses += len(missing - reported)


def four_processes(trials: int, seed: int = 5) -> FaultResult:
    """Four processes write and read one store directory under a tight shared budget."""
    res = FaultResult("four_processes_one_store",
                      method="4 processes x 2 s of puts and cross-reads on one store_path; "
                             "budget = 40 chunks; every read checked against its key's bytes")
    return repeat(res, trials, lambda _: _four_trial(res, seed))


def _four_trial(res: FaultResult, seed: int) -> None:
    budget = 40 * CHUNK_BYTES
    with scratch() as root:
        procs = [subprocess.Popen([sys.executable, "-m", __name__, "mixer", str(root),
                                   str(budget), str(w), str(seed)], stdout=subprocess.PIPE,
                                  text=True, env=child_env()) for w in range(4)]
        for proc in procs:
            out, _ = proc.communicate(timeout=300)
            try:
                report = json.loads(out.strip().splitlines()[-1])
            except (ValueError, IndexError):
                res.exceptions += 1  # the child died
                continue
            res.exceptions += report["exceptions"]
            res.wrong_bytes_served += report["wrong"]
            res.misses += report["misses"]
        on_disk = sum(file_entry(p, p.name.split(".")[0])[0]
                      for p in (root / "kv" / "chunks").rglob("*.safetensors"))
        res.over_budget_bytes += max(0, on_disk - budget)


def _writer(root: Path, mode: str, prefix: int) -> None:
    disk = DiskStore(root / "kv", 1 << 34)
    store = TieredStore(MemoryStore(1 << 30), disk,
                        write_behind_bytes=(1 << 30) if mode == "async" else 0)
    for key in keys(prefix, 100_000):
        if store.put(key, chunk_for(key)):
            print(key, flush=True)


def _mixer(root: Path, budget: int, worker: int, seed: int) -> None:
    rng = random.Random(seed * 10 + worker)
    store = DiskStore(root / "kv", budget)
    mine = keys(worker, 10_000)
    report = {"exceptions": 0, "wrong": 0, "misses": 0, "reads": 0}
    deadline, i = time.monotonic() + 2.0, 0
    while time.monotonic() < deadline:
        try:
            store.put(mine[i], chunk_for(mine[i]))
            other = key_of(rng.randrange(4), rng.randrange(i + 1))
            got = store.get(other)
            report["reads"] += 1
            if got is None:
                report["misses"] += 1
            elif not same(got, chunk_for(other)):
                report["wrong"] += 1
        except Exception:
            report["exceptions"] += 1
        i += 1
    store.close()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    role, args = sys.argv[1], sys.argv[2:]
    if role == "writer":
        _writer(Path(args[0]), args[1], int(args[2]))
    elif role == "mixer":
        _mixer(Path(args[0]), int(args[1]), int(args[2]), int(args[3]))
    else:
        raise SystemExit(f"unknown role {role!r}")
