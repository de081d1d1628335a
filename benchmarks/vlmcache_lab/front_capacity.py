"""The front's own capacity: ``vlmcache proxy`` before an instant fake upstream.

The upstream (:func:`instant_upstream`, its own uvicorn process) answers every chat
completion at once, so what a client sees through the proxy is the front's work: decode,
hash, tier lookups, rewrite, capture. Per tier (``miss``: a new image each request;
``response``: repeats of primed requests; ``exact``: spacing variants of them; ``image``:
JPEG re-encodes of their images; these two skip the response tier with the request option
``{"response_cache": false}``, else every pass after the first would be a response hit)
and per number of closed-loop clients, the same requests
are sent straight to the upstream and through the proxy; ``added_ms_p50`` / ``_p99`` are
the differences of those percentiles, ``rps`` the proxy's rate.

    python benchmarks/front_capacity.py --model benchmarks/geometries/qwen2vl7b \\
        --clients 1,16,64 --seconds 6 --out benchmarks/results/front-capacity.json
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from vlmcache.testing.server import free_port
from vlmcache_lab.serve_gpu_trace import QUESTIONS, ImageSpec, TraceRequest

TIERS = ("miss", "response", "exact", "image")
NOTES = ["added_ms = proxy percentile - direct percentile at the same client count; at 64 "
         "clients both include queueing in one client process, so p99 differences can be "
         "negative (noise), not a speed-up",
         "the 'exact' workload is decided 'miss' by the front here: the exact tier records a "
         "request only with the engine's KV row keys (kv_transfer_params), which the instant "
         "upstream does not send; its row measures a known image with a new text (response "
         "tier skipped), not an exact-tier hit",
         "'exact' and 'image' bodies carry vlmcache.response_cache=false (else every pass "
         "after the first would be a response hit)"]
POOL = 32


async def instant_upstream(scope: Any, receive: Any, send: Any) -> None:
    """ASGI app: every POST gets a fixed chat completion at once; GET /health 200."""
    if scope["type"] != "http":
        return
    while scope["method"] == "POST" and (await receive()).get("more_body"):
        pass
    raw = json.dumps({"id": "chatcmpl-x", "object": "chat.completion", "created": 0,
                      "model": "m", "choices": [{"index": 0, "finish_reason": "stop",
                      "message": {"role": "assistant", "content": "a blue circle"}}],
                      "usage": {"prompt_tokens": 200, "completion_tokens": 4,
                                "total_tokens": 204}}).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode())]})
    await send({"type": "http.response.body", "body": raw})


def _body(req: TraceRequest, model: str, seed: int) -> dict[str, Any]:
    return req.body(model, seed, stream=False)


def tier_bodies(tier: str, model: str, seed: int, n: int, start: int) -> list[dict[str, Any]]:
    """``n`` bodies that the front decides in ``tier`` once the pool is primed; ``miss``
    bodies use new images from ``start`` on (never seen before)."""
    out = []
    for k in range(n):
        q = QUESTIONS[k % len(QUESTIONS)][0]
        base = k % POOL
        if tier == "miss":
            req = TraceRequest(tier, "cap", ImageSpec(1_000_000 + start + k), q, 8)
        elif tier == "response":
            req = TraceRequest(tier, "cap", ImageSpec(base), QUESTIONS[base % 8][0], 8)
        elif tier == "exact":  # spacing and sentence case: another response key
            text = "  " + QUESTIONS[base % 8][0].capitalize() + " " * (1 + k % 3)
            req = TraceRequest(tier, "cap", ImageSpec(base), text, 8)
        else:
            req = TraceRequest(tier, "cap", ImageSpec(base, "jpeg", 90),
                               QUESTIONS[base % 8][0], 8)
        body = _body(req, model, seed)
        if tier in ("exact", "image"):  # else the second pass would be response hits
            body["vlmcache"] = {"response_cache": False}
        out.append(body)
    return out


async def closed_loop(url: str, bodies: Sequence[dict[str, Any]], clients: int,
                      seconds: float) -> dict[str, Any]:
    """``clients`` workers cycle through ``bodies`` for ``seconds``: latencies, rps, tiers."""
    import httpx

    lat: list[float] = []
    tiers: dict[str, int] = {}
    errors = 0
    stop = time.perf_counter() + seconds
    cursor = iter(range(10**9))

    async def worker(client: httpx.AsyncClient) -> None:
        nonlocal errors
        while time.perf_counter() < stop:
            body = bodies[next(cursor) % len(bodies)]
            t0 = time.perf_counter()
            resp = await client.post("/v1/chat/completions", json=body)
            lat.append((time.perf_counter() - t0) * 1000)
            errors += resp.status_code != 200
            tier = resp.headers.get("x-vlmcache-hit-tier", "-")
            tiers[tier] = tiers.get(tier, 0) + 1

    limits = httpx.Limits(max_connections=clients + 4)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(worker(client) for _ in range(clients)))
        wall = time.perf_counter() - t0
    return {"requests": len(lat), "errors": errors, "rps": round(len(lat) / wall, 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 3),
            "p99_ms": round(float(np.percentile(lat, 99)), 3), "tiers": tiers}


def _start(argv: list[str], log: Path, url: str) -> subprocess.Popen[bytes]:
    import httpx

    proc = subprocess.Popen(argv, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    for _ in range(240):
        if proc.poll() is not None:
            raise RuntimeError(f"{argv[2]} exited: {log.read_text()[-3000:]}")
        try:
            httpx.get(url + "/health", timeout=1)  # any answer: it listens
            return proc
        except httpx.HTTPError:
            time.sleep(0.5)
    proc.kill()
    raise RuntimeError(f"{argv} did not start")


def wait_for_workers(store: Path, workers: int, timeout_s: float = 120.0) -> None:
    """Until every proxy worker holds its slot (its front is built)."""
    import fcntl
    import os

    from vlmcache.serving.proxy_workers import WORKERS_DIR

    deadline = time.monotonic() + timeout_s
    for k in range(workers):
        lock = store / WORKERS_DIR / f"w{k}" / "lock"
        while True:
            if lock.exists():
                fd = os.open(lock, os.O_RDWR)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(fd, fcntl.LOCK_UN)
                except BlockingIOError:
                    break
                finally:
                    os.close(fd)
            if time.monotonic() > deadline:
                raise RuntimeError(f"proxy worker {k} did not start")
            time.sleep(0.2)


def measure(args: Any, upstream: str, proxy: str) -> dict[str, Any]:
    """Every tier x client count, straight and through the proxy."""
    miss_start = 0
    out: dict[str, Any] = {}
    import httpx

    with httpx.Client(base_url=proxy, timeout=60) as client:  # prime the pool, one by one
        for body in tier_bodies("response", args.model, 0, POOL, 0):
            client.post("/v1/chat/completions", json=body).raise_for_status()
    if args.workers > 1:  # every worker learns the pool's records (sync every 0.2 s)
        time.sleep(2.0)
    for clients in (int(c) for c in args.clients.split(",")):
        for tier in TIERS:
            n = max(64, clients * 8) if tier != "miss" else int(args.seconds * args.miss_rps)
            bodies = tier_bodies(tier, args.model, 0, n, miss_start)
            miss_start += n if tier == "miss" else 0
            direct = asyncio.run(closed_loop(upstream, bodies, clients, args.seconds))
            front = asyncio.run(closed_loop(proxy, bodies, clients, args.seconds))
            out.setdefault(tier, {})[str(clients)] = {
                "added_ms_p50": round(front["p50_ms"] - direct["p50_ms"], 3),
                "added_ms_p99": round(front["p99_ms"] - direct["p99_ms"], 3),
                "rps": front["rps"], "proxy": front, "direct": direct}
    return out


@dataclass
class Front:
    """A started proxy before the instant upstream: their URLs, the proxy's start time."""

    upstream: str
    proxy: str
    proxy_start_s: float


@contextmanager
def front_before_instant_upstream(model: str, workers: int, work: Path,
                                  sets: dict[str, str]) -> Iterator[Front]:
    """Start the instant upstream, then ``vlmcache proxy MODEL`` with ``sets`` (and, for
    more than one worker, a loopback Redis, whose URL ``sets`` gains); stop them after."""
    up_port, px_port = free_port(), free_port()
    upstream, proxy = f"http://127.0.0.1:{up_port}", f"http://127.0.0.1:{px_port}"
    redis: Any = None
    procs: list[subprocess.Popen[bytes]] = []
    try:
        if workers > 1:  # the workers share their tiers through a loopback Redis
            from vlmcache.testing.redis_server import RedisServer

            redis = RedisServer(maxmemory="1gb")
            redis.start()
            sets.update({"redis_url": redis.url, "redis_sync_interval_s": "0.2"})
        procs.append(_start([sys.executable, "-m", "uvicorn",
                             "vlmcache_lab.front_capacity:instant_upstream", "--port",
                             str(up_port), "--log-level", "warning"], work / "up.log", upstream))
        t0 = time.perf_counter()
        procs.append(_start([sys.executable, "-m", "vlmcache.cli", "proxy", model,
                             "--upstream", upstream, "--port", str(px_port),
                             "--workers", str(workers),
                             *[a for k, v in sets.items()
                               for a in ("--vlmcache-set", f"{k}={v}")]],
                            work / "proxy.log", proxy))
        start_s = round(time.perf_counter() - t0, 2)
        if workers > 1:
            wait_for_workers(work / "store", workers)
        yield Front(upstream, proxy, start_s)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(timeout=30)
        if redis is not None:
            redis.stop()


def run_servers(args: Any, work: Path, sets: dict[str, str]) -> dict[str, Any]:
    """Start the instant upstream, the proxy (and Redis for its workers), measure every
    tier; ``sets`` gains the Redis URL it was given."""
    with front_before_instant_upstream(args.model, args.workers, work, sets) as front:
        return measure(args, front.upstream, front.proxy)


def main(argv: Sequence[str] | None = None) -> int:
    """Start the instant upstream and the proxy, measure, write the JSON."""
    import argparse
    import os
    import tempfile

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="model folder the proxy's front loads")
    p.add_argument("--clients", default="1,16,64")
    p.add_argument("--seconds", type=float, default=6.0, help="per tier and client count")
    p.add_argument("--miss-rps", type=float, default=600.0,
                   help="new images made per second of a miss run (more: some repeat)")
    p.add_argument("--gpu-highest-rate", type=float, default=None,
                   help="the GPU benchmark's highest arrival rate, to compare with")
    p.add_argument("--workers", type=int, default=1,
                   help="proxy workers (more than 1: a loopback redis-server is started "
                   "for them to share through)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="more front config (e.g. enable_semantic_text=true)")
    p.add_argument("--device", default=None)
    p.add_argument("--out", default="front-capacity.json")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="front-capacity-"))
    sets = {"model_revision": "dummy-weights", "enable_image_embedding": "true",
            "log_requests": "false", "store_path": str(work / "store")}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            p.error(f"--set {item!r}: expected KEY=VALUE")
        sets[key] = value
    tiers = run_servers(args, work, sets)
    max_rps = {t: max(v["rps"] for v in by.values()) for t, by in tiers.items()}
    result = {"command": "python benchmarks/front_capacity.py " + " ".join(argv),
              "device": args.device or f"{os.cpu_count()} CPU cores",
              "front_config": sets, "workers": args.workers,
              "seconds_per_run": args.seconds,
              "max_rps": max_rps, "tiers": tiers,
              "gpu_highest_rate": args.gpu_highest_rate, "notes": NOTES,
              "front_bottleneck_at_gpu_rate": (None if args.gpu_highest_rate is None
                                               else max_rps["miss"] < args.gpu_highest_rate)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({"max_rps": max_rps, **{t: {c: (v["added_ms_p50"], v["added_ms_p99"])
                      for c, v in by.items()} for t, by in tiers.items()}}, indent=1))
    return 0
