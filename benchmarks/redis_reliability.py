"""Redis fault kinds -> benchmarks/results/reliability.json (merged into the file, not
overwriting the other kinds).

    python benchmarks/redis_reliability.py [--trials 20] [--out benchmarks/results/reliability.json]

Starts its own redis-server (loopback, no persistence, maxmemory 256mb volatile-lru).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from pathlib import Path

from vlmcache_lab import redis_faults as rf
from vlmcache_lab.reliability import merge
from vlmcache.testing.redis_server import RedisServer


def device() -> str:
    return f"{platform.node()}: {os.cpu_count()} CPU cores, {platform.platform()}, no GPU"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/reliability.json"))
    args = ap.parse_args()
    command = "python " + " ".join(shlex.quote(a) for a in sys.argv)
    server = RedisServer()
    server.start()
    work = Path(tempfile.mkdtemp(prefix="vlmcache-redis-faults-"))
    plan = [lambda: rf.kill_restart(server, args.trials),
            lambda: rf.hung(server, args.trials * 10),
            lambda: rf.corrupt(server, args.trials * 10),
            lambda: rf.four_processes(server, args.trials * 50, work),
            lambda: rf.kill_writer(server, max(args.trials // 4, 2), work)]
    entries: dict[str, dict[str, object]] = {}
    try:
        for trial in plan:
            started = time.perf_counter()
            r = trial()
            entries[r.kind] = {"kind": r.kind, **r.as_json(), "command": command,
                               "device": device(), "wall_s": round(time.perf_counter() - started, 1),
                               "redis": "redis-server 7.0 (Debian) on loopback, no persistence; "
                                        "vlmcache socket timeout 5 ms"}
            print(json.dumps(entries[r.kind]), flush=True)
    finally:
        server.stop()
    merge(args.out, entries, command)


if __name__ == "__main__":
    main()
