"""The first requests after a start: ``vlmcache proxy`` (paraphrase and image tiers on)
before an instant fake upstream (``front_capacity.instant_upstream``), ``--requests`` new
images with new questions sent one at a time as soon as the proxy answers ``/health``.
Each one's latency through the proxy is the front's work on a miss; a front that loads
its embedders lazily makes its first miss wait for the weights (in every proxy worker).

    python benchmarks/first_requests.py --model benchmarks/geometries/qwen2vl7b \\
        --requests 12 --out benchmarks/results/first-requests/after.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from vlmcache_lab.front_capacity import front_before_instant_upstream, tier_bodies

SETS = {"model_revision": "dummy-weights", "enable_image_embedding": "true",
        "enable_semantic_text": "true", "log_requests": "false"}


def first_latencies(url: str, bodies: Sequence[dict[str, Any]]) -> list[float]:
    """Milliseconds per request, sent one after the other."""
    import httpx

    out = []
    with httpx.Client(timeout=120) as client:
        for body in bodies:
            t0 = time.perf_counter()
            r = client.post(url + "/v1/chat/completions", json=body)
            r.raise_for_status()
            out.append(round((time.perf_counter() - t0) * 1000, 2))
    return out


def run(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    sets = {**SETS, "store_path": str(work / "store")}
    with front_before_instant_upstream(args.model, 1, work, sets) as front:
        ms = first_latencies(front.proxy, tier_bodies("miss", "m", 0, args.requests, 0))
    log = (work / "proxy.log").read_text(errors="replace")
    return {"start_to_health_s": front.proxy_start_s, "latency_ms": ms, "first_ms": ms[0],
            "rest_max_ms": max(ms[1:]) if len(ms) > 1 else None,
            "warm_up_logged": [ln for ln in log.splitlines() if "embedders loaded" in ln]}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="benchmarks/geometries/qwen2vl7b")
    p.add_argument("--requests", type=int, default=12)
    p.add_argument("--label", default="", help="what this run is (e.g. the commit)")
    p.add_argument("--out", default="first-requests.json")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="first-requests-") as tmp:
        result = run(args, Path(tmp))
    result = {"command": "python benchmarks/first_requests.py " + " ".join(sys.argv[1:]),
              "label": args.label,
              "device": f"CPU ({platform.machine()}), {os.cpu_count()} cores",
              "config": SETS, **result}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: result[k] for k in ("start_to_health_s", "latency_ms")}))
    return 0
