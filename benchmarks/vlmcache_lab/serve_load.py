"""Serving load benchmark: many concurrent OpenAI clients against ``vlmcache serve``.

Starts one real server (:class:`ServerProcess`: ``vlmcache serve`` on loopback, vLLM's
default process layout) on the trained tiny-vqa model, then replays a mixed request list
from ``concurrency`` clients: first asks, exact repeats, spacing/case variants,
paraphrases (held-out rewordings), near-duplicate images (JPEG re-encodes) and a second
tenant. Per request it records the status, end-to-end latency, the deciding tier and the
front's time per stage (``vlmcache.front_ms``); the summary has per-tier hit counts, the
front's overhead on a miss (p50 per stage) and response-tier hit latencies.
``--check-answers`` adds a no-cache pass (every distinct request again with
``"vlmcache": {"bypass": true}``) and counts the answers equal to it and to easy-vqa's ground
truth (:mod:`vlmcache_lab.answer_check`); ``--vlmcache-set KEY=VALUE`` changes a key of the
server's vlmcache config.

    python benchmarks/serve.py --requests 1200 --concurrency 16 --out benchmarks/results/serve.json
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from vlmcache.testing.server import ServerProcess, data_url


@dataclass(frozen=True)
class LoadRequest:
    """One request of the mix: its kind, tenant, question and image (as a data URL), and
    easy-vqa's answer to it (``truth``; a paraphrase or a re-encode keeps its source's)."""

    kind: str
    tenant: str
    question: str
    image_url: str
    truth: str | None = None
    bypass: bool = False  # the no-cache pass: every vlmcache tier skipped

    def body(self, model: str) -> dict[str, object]:
        body: dict[str, object] = {
            "model": model, "temperature": 0, "max_tokens": 4, "cache_salt": self.tenant,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": self.image_url}},
                {"type": "text", "text": self.question}]}]}
        if self.bypass:
            body["vlmcache"] = {"bypass": True}
        return body


def build_mix(n: int, seed: int = 0, pool: int = 60) -> list[LoadRequest]:
    """``n`` requests over ``pool`` easy-vqa questions, in a shuffled but causal order:
    each variant of a pair comes after the pair was first asked."""
    from PIL import Image

    from vlmcache.bench.datasets import load_easy_vqa
    from vlmcache.models.paraphrases import paraphrase

    rng = np.random.default_rng(seed)
    samples = load_easy_vqa("test", limit=pool * 4)[::4][:pool]
    firsts = [LoadRequest("first", "tenant-a", s.question,
                          data_url(Image.open(s.image_path)), s.answer) for s in samples]
    out = list(firsts)
    kinds = ("repeat", "spacing", "paraphrase", "near_duplicate", "other_tenant")
    weights = (0.45, 0.15, 0.15, 0.15, 0.10)
    while len(out) < n:
        k = int(rng.integers(len(samples)))
        s, first = samples[k], firsts[k]
        kind = kinds[int(rng.choice(len(kinds), p=weights))]
        if kind == "repeat":
            out.append(LoadRequest(kind, first.tenant, first.question, first.image_url,
                                   s.answer))
        elif kind == "spacing":
            out.append(LoadRequest(kind, first.tenant, "  " + s.question.capitalize() + " ",
                                   first.image_url, s.answer))
        elif kind == "paraphrase":
            out.append(LoadRequest(kind, first.tenant, paraphrase(s.question, int(rng.integers(4))),
                                   first.image_url, s.answer))
        elif kind == "near_duplicate":
            out.append(LoadRequest(kind, first.tenant, s.question,
                                   data_url(Image.open(s.image_path), "JPEG", 90), s.answer))
        else:
            out.append(LoadRequest(kind, "tenant-b", s.question, first.image_url, s.answer))
    head, tail = out[:len(samples)], out[len(samples):]
    rng.shuffle(tail)  # type: ignore[arg-type]
    return head + tail


async def _client(url: str, model: str, queue: "asyncio.Queue[tuple[int, LoadRequest]]",
                  rows: list[dict[str, Any]]) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        while True:
            try:
                i, req = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            t0 = time.perf_counter()
            try:
                resp = await client.post("/v1/chat/completions", json=req.body(model))
                status, body = resp.status_code, resp.json()
            except Exception as exc:  # counted as an error, never hidden
                status, body = -1, {"error": repr(exc)}
            rows.append({"i": i, "kind": req.kind, "tenant": req.tenant, "status": status,
                         "e2e_ms": (time.perf_counter() - t0) * 1000,
                         "report": body.get("vlmcache") if isinstance(body, dict) else None,
                         "answer": _answer(body)})


def _answer(body: Any) -> str | None:
    try:
        return str(body["choices"][0]["message"]["content"])
    except (KeyError, IndexError, TypeError):
        return None


async def run_load(url: str, model: str, requests: Sequence[LoadRequest],
                   concurrency: int, warm: int) -> list[dict[str, Any]]:
    """Send the first ``warm`` requests (the first asks) one by one, the rest from
    ``concurrency`` clients at once."""
    rows: list[dict[str, Any]] = []
    items = list(enumerate(requests))
    for stage, workers in ((items[:warm], 1), (items[warm:], concurrency)):
        queue: asyncio.Queue[tuple[int, LoadRequest]] = asyncio.Queue()
        for item in stage:
            queue.put_nowait(item)
        await asyncio.gather(*(_client(url, model, queue, rows) for _ in range(workers)))
    return sorted(rows, key=lambda r: r["i"])


def probe(url: str, model: str, requests: Sequence[LoadRequest], n: int,
          kind: str) -> list[dict[str, Any]]:
    """Send ``n`` requests one at a time (one client, one kept-alive connection)."""
    import httpx

    rows = []
    with httpx.Client(base_url=url, timeout=300) as client:
        for i in range(n):
            req = requests[i % len(requests)]
            t0 = time.perf_counter()
            resp = client.post("/v1/chat/completions", json=req.body(model))
            rows.append({"i": i, "kind": kind, "tenant": req.tenant,
                         "status": resp.status_code,
                         "e2e_ms": (time.perf_counter() - t0) * 1000,
                         "report": resp.json().get("vlmcache"), "answer": None})
    return rows


def probe_requests(pool: int, n: int) -> list[LoadRequest]:
    """Unseen questions for a tenant no load request used: every tier misses."""
    from PIL import Image

    from vlmcache.bench.datasets import load_easy_vqa

    samples = load_easy_vqa("test", limit=(pool + n) * 4)[pool * 4::4][:n]
    return [LoadRequest("probe_miss", "tenant-probe", s.question,
                        data_url(Image.open(s.image_path))) for s in samples]


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Errors, per-tier hit counts, miss overhead per stage, response-hit latencies."""
    ok = [r for r in rows if r["status"] == 200 and r["report"]]
    hits: dict[str, int] = {}
    for r in ok:
        tier = r["report"].get("hit_tier") or "miss"
        hits[tier] = hits.get(tier, 0) + 1
    misses = [r for r in ok if not r["report"].get("hit_tier")]
    stages = sorted({k for r in misses for k in (r["report"].get("front_ms") or {})})
    overhead = {k: _p50([r["report"]["front_ms"][k] for r in misses
                         if k in r["report"]["front_ms"]]) for k in stages}
    overhead["total"] = _p50([sum(r["report"]["front_ms"].values()) for r in misses])
    resp = [r for r in ok if r["report"].get("hit_tier") == "response"]
    by_kind: dict[str, dict[str, int]] = {}
    for r in ok:
        tier = r["report"].get("hit_tier") or "miss"
        by_kind.setdefault(r["kind"], {}).setdefault(tier, 0)
        by_kind[r["kind"]][tier] += 1
    return {"requests": len(rows), "errors": len(rows) - len(ok), "hits_by_tier": hits,
            "hits_by_kind": by_kind, "miss_overhead_ms_p50": overhead,
            "response_hit_ms_p50": {
                "server": _p50([r["report"]["latency_s"] * 1000 for r in resp]),
                "end_to_end": _p50([r["e2e_ms"] for r in resp])},
            "miss_e2e_ms_p50": _p50([r["e2e_ms"] for r in misses])}


def idle_summary(hits: Sequence[dict[str, Any]],
                 misses: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The headline latencies, from the one-client probes after the load; the figures
    under load move to ``*_under_load``."""
    miss, hit = summarize(misses), summarize(hits)
    return {"miss_overhead_ms_p50": miss["miss_overhead_ms_p50"],
            "miss_e2e_ms_p50": miss["miss_e2e_ms_p50"],
            "response_hit_ms_p50": hit["response_hit_ms_p50"],
            "probes": {"hits_sent": len(hits), "hit_tiers": hit["hits_by_tier"],
                       "misses_sent": len(misses), "miss_tiers": miss["hits_by_tier"],
                       "errors": hit["errors"] + miss["errors"]}}


def _with_load_figures(load: dict[str, Any]) -> dict[str, Any]:
    """The load's latency figures renamed ``*_under_load`` (the probes give the headline)."""
    for key in ("miss_overhead_ms_p50", "miss_e2e_ms_p50", "response_hit_ms_p50"):
        load[key + "_under_load"] = load.pop(key)
    return load


def _p50(values: Sequence[float]) -> float | None:
    return round(float(np.percentile(values, 50)), 4) if values else None


SERVER_CONFIG: dict[str, object] = {"block_size": 32, "enable_semantic_text": True,
                                    "enable_image_embedding": True, "log_requests": False,
                                    "memory_budget": "512MiB"}


def _args(argv: Sequence[str] | None) -> Any:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=1200)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--pool", type=int, default=60, help="distinct first questions")
    p.add_argument("--seed", type=int, default=0, help="seed of the request mix")
    p.add_argument("--probes", type=int, default=200,
                   help="response-tier hits sent one at a time after the load")
    p.add_argument("--vlmcache-set", action="append", default=[], metavar="KEY=VALUE",
                   help="a vlmcache config key of the server (VALUE as JSON, else a string)")
    p.add_argument("--check-answers", action="store_true",
                   help="a no-cache pass after the load; answers checked against it and "
                        "against easy-vqa's ground truth")
    p.add_argument("--rows-out", default=None,
                   help="write per-request rows (tier, answer, truth) to this JSON file")
    p.add_argument("--out", default="benchmarks/results/serve.json")
    return p.parse_args(argv)


def config_overrides(pairs: Sequence[str]) -> dict[str, object]:
    """``["response_after_canonical=true", ...]`` as config values (JSON, else strings)."""
    import json

    out: dict[str, object] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep or not key:
            raise SystemExit(f"--vlmcache-set: expected KEY=VALUE, got {pair!r}")
        try:
            out[key] = json.loads(raw)
        except ValueError:
            out[key] = raw
    return out


def _measure(server: ServerProcess, model: str, args: Any,
             mix: list[LoadRequest]) -> dict[str, Any]:
    """The load, the idle probes and (``--check-answers``) the no-cache pass."""
    t0 = time.perf_counter()
    rows = asyncio.run(run_load(server.url, model, mix, args.concurrency, args.pool))
    wall = time.perf_counter() - t0
    # idle probes, one client: response-tier hits (the first asks, all answered by now)
    # and fresh misses (a new tenant: every tier looks up and misses)
    hits = probe(server.url, model, mix[:args.pool], args.probes, "probe_hit")
    misses = probe(server.url, model, probe_requests(args.pool, 30), 30, "probe_miss")
    out: dict[str, Any] = {"wall_s": round(wall, 2), **_with_load_figures(summarize(rows)),
                           **idle_summary(hits, misses)}
    if args.check_answers or args.rows_out:
        from vlmcache_lab import answer_check as check

        if args.check_answers:
            reference, failed = check.no_cache_answers(server.url, model, mix,
                                                       args.concurrency)
            out["answers"] = {"no_cache_requests": len(reference), "no_cache_errors": failed,
                              **check.check_answers(rows, mix, reference)}
            out["no_cache"] = {f"{q}\n{check.image_id(u)}": a for (q, u), a in reference.items()}
        out["e2e_ms_p50_by_kind_under_load"] = check.latency_by(rows, "kind")
        out["rows"] = check.compact_rows(rows, mix)
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """``python benchmarks/serve.py``: start the server, replay the mix, write the JSON."""
    import json
    import platform
    import tempfile

    from vlmcache.models.tiny_vqa import build_tiny_vqa

    args = _args(argv)
    work = Path(tempfile.mkdtemp(prefix="vlmcache-serve-bench-"))
    model = build_tiny_vqa(work / "tiny-vqa")
    config = {**SERVER_CONFIG, "store_path": str(work / "store"),
              **config_overrides(args.vlmcache_set)}
    server = ServerProcess(Path(model), config, work / "server.log").start()
    try:
        measured = _measure(server, str(model), args,
                            build_mix(args.requests, seed=args.seed, pool=args.pool))
    finally:
        server.stop()
    rows = measured.pop("rows", None)
    no_cache = measured.pop("no_cache", None)
    result = {"command": "python benchmarks/serve.py " + " ".join(
        sys.argv[1:] if argv is None else argv),
        "device": f"CPU only ({os.cpu_count()} cores, {platform.processor() or platform.machine()})"
                  f", vLLM-CPU, tiny-vqa, one `vlmcache serve` process layout (API server, "
                  "EngineCore, worker), loopback HTTP",
        "concurrency": args.concurrency, "seed": args.seed, "server_config": config,
        **measured}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    if args.rows_out:
        Path(args.rows_out).write_text(json.dumps({"rows": rows, "no_cache": no_cache}) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "server_config"}, indent=2))
    return 0 if result["errors"] == 0 else 1
