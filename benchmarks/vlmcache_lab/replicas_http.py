"""Two ``vlmcache serve`` replicas sharing one Redis, driven over HTTP with the ``openai``
client: what one server answered, the other reuses.

Each replica is a full server in vLLM's default layout (API server with the front, EngineCore,
worker), with its own store directory and the same ``redis_url``. Steps:

1. A answers requests; B then gets the same requests (B never saw them: any reuse in B came
   through Redis: responses, exact records, KV chunks);
2. Redis is SIGKILLed; both keep answering new requests (misses, no errors);
3. Redis restarts (empty); A answers new requests, then B gets them (sharing resumed).

``shared_hits`` counts B's requests (steps 1 and 3) answered with reuse (a cascade hit or KV
tokens loaded); ``errors`` counts requests that failed (an exception or a non-200 answer).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vlmcache_lab.redis_replicas import three_steps
from vlmcache.testing.server import ServerProcess, data_url

QUESTION = "What shape is in the image, and which colours does it have?"
TENANT = "acme"


@dataclass
class HttpReplicaRun:
    """The ``replicas`` entry of reliability.json."""

    requests: int = 0
    errors: int = 0
    shared_hits: int = 0
    shared_hits_after_restart: int = 0
    deciding_tiers: dict[str, int] = field(default_factory=dict)
    same_answer_as_first_replica: int = 0
    compared: int = 0
    outage_requests: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)


def _image(seed: int) -> Any:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (64, 64, 3), dtype=np.uint8))


def ask(url: str, model: str, seed: int) -> dict[str, Any]:
    """One chat request through the ``openai`` client: answer, deciding tier, KV figures."""
    import openai

    client = openai.OpenAI(base_url=url + "/v1", api_key="unused", timeout=300, max_retries=0)
    start = time.perf_counter()
    try:
        resp = client.chat.completions.create(
            model=model, temperature=0, max_tokens=4, extra_body={"cache_salt": TENANT},
            messages=[{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": data_url(_image(seed))}},
                {"type": "text", "text": QUESTION}]}])
    except Exception as exc:  # counted as an error
        return {"seed": seed, "error": f"{type(exc).__name__}: {exc}"[:300]}
    report = (resp.model_extra or {}).get("vlmcache") or {}
    return {"seed": seed, "answer": resp.choices[0].message.content,
            "hit_tier": report.get("hit_tier"), "tokens_loaded": report.get("tokens_loaded", 0),
            "e2e_ms": round((time.perf_counter() - start) * 1e3, 1)}


def run_http_replicas(model: Path, work: Path, redis: Any, settle_s: float = 1.5
                      ) -> HttpReplicaRun:
    """The three steps of the module docstring against ``redis`` (a ``RedisServer``)."""
    config = {"block_size": 32, "memory_budget": "256MiB", "redis_url": redis.url,
              "redis_sync_interval_s": 0.1, "redis_backoff_max_s": 0.5}
    servers = [ServerProcess(model, {**config, "store_path": str(work / f"store-{n}")},
                             work / f"server-{n}.log") for n in ("a", "b")]
    res = HttpReplicaRun()
    try:
        a, b = (s.start() for s in servers)
        name = str(model)
        res.shared_hits, res.shared_hits_after_restart, res.outage_requests = three_steps(
            lambda seeds: [ask(a.url, name, s) for s in seeds],
            lambda seeds: [ask(b.url, name, s) for s in seeds], redis,
            lambda who, rows, first: _tally(res, who, rows, first), settle_s)
    finally:
        for server in servers:
            server.stop()
    return res


def _tally(res: HttpReplicaRun, who: str, rows: list[dict[str, Any]],
           first: dict[int, str] | None) -> Any:
    """Count errors; for B (``first`` given) count reuse and answers equal to A's."""
    reused = 0
    for row in rows:
        res.requests += 1
        row["replica"] = who
        res.rows.append(row)
        if "error" in row or row.get("answer") is None:
            res.errors += 1
            continue
        if first is not None:
            tier = row["hit_tier"] or ("kv" if row["tokens_loaded"] else "miss")
            res.deciding_tiers[tier] = res.deciding_tiers.get(tier, 0) + 1
            reused += tier != "miss"
            if first.get(row["seed"]) is not None:
                res.compared += 1
                res.same_answer_as_first_replica += row["answer"] == first[row["seed"]]
    if first is None:
        return {r["seed"]: r.get("answer") for r in rows}
    return reused


def result_dict(res: HttpReplicaRun) -> dict[str, Any]:
    return asdict(res)
