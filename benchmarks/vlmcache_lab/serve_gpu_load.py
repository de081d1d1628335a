"""Open-loop load on an OpenAI server and its summary (``serve_gpu``'s measuring half).

:func:`run_phase` sends each request at its Poisson arrival time whether or not earlier
ones have finished (open loop: a slow server builds a queue, as with real users), streams
the answer and records TTFT, end-to-end time and the deciding vlmcache tier
(``x-vlmcache-hit-tier`` header; plain vLLM has none). TTFT is taken, for every server
alike, at the first chunk that carries a generated token: its usage (requests ask for
``continuous_usage_stats``) counts ``completion_tokens >= 1``, or a choice has text or a
finish reason (``ttft_by`` says which; dummy weights' tokens can stream as empty text). :func:`summarize`
turns one phase's rows into throughput, goodput under a stated SLO and percentiles.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np


JSON_HEADERS = {"content-type": "application/json"}
try:  # the client parses ~20 chunks a request: at 100 req/s its own loop is a cost
    from orjson import loads as _loads
except ImportError:  # pragma: no cover - orjson is a vlmcache dependency
    _loads = json.loads


@dataclass(frozen=True)
class Slo:
    """A request meets the SLO when its TTFT and its end-to-end time are both within."""

    ttft_ms: float = 1000.0
    e2e_ms: float = 3000.0

    def met(self, row: dict[str, Any]) -> bool:
        return (row.get("status") == 200 and row.get("ttft_ms") is not None
                and row["ttft_ms"] <= self.ttft_ms and row["e2e_ms"] <= self.e2e_ms)

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


async def _send(client: Any, i: int, body: bytes, kind: str) -> dict[str, Any]:
    """One streamed request (``body``: its JSON, written before the phase): status, TTFT,
    e2e, tier, output tokens."""
    row: dict[str, Any] = {"i": i, "kind": kind, "status": -1, "ttft_ms": None,
                           "ttft_by": None, "e2e_ms": None, "tier": None, "tokens": 0}
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", "/v1/chat/completions", content=body,
                                 headers=JSON_HEADERS) as resp:
            row["status"] = resp.status_code
            row["tier"] = resp.headers.get("x-vlmcache-hit-tier")
            async for line in resp.aiter_lines():
                _on_line(row, line, t0)
    except Exception as exc:  # counted as an error, never hidden
        row["status"], row["error"] = -1, repr(exc)[:200]
    row["e2e_ms"] = (time.perf_counter() - t0) * 1000
    if row["status"] == 200 and row["ttft_ms"] is None:  # no token seen before the end
        row["ttft_ms"], row["ttft_by"] = row["e2e_ms"], "end"
    return row


def _on_line(row: dict[str, Any], line: str, t0: float) -> None:
    if not line.startswith("data:") or line.strip() == "data: [DONE]":
        return
    try:
        chunk = _loads(line[5:])
    except ValueError:  # orjson's JSONDecodeError is one too
        return
    if not isinstance(chunk, dict):
        return
    if row["ttft_ms"] is None:
        by = first_token_mark(chunk)
        if by is not None:
            row["ttft_ms"], row["ttft_by"] = (time.perf_counter() - t0) * 1000, by
    if isinstance(chunk.get("usage"), dict):
        row["tokens"] = int(chunk["usage"].get("completion_tokens") or 0)
        row["usage_prompt_tokens"] = int(chunk["usage"].get("prompt_tokens") or 0)
        details = chunk["usage"].get("prompt_tokens_details")
        if isinstance(details, dict):  # vLLM's prefix-cache hit (--enable-prompt-tokens-details)
            row["cached_tokens"] = int(details.get("cached_tokens") or 0)
    if isinstance(chunk.get("vlmcache"), dict):
        report = chunk["vlmcache"]
        row["tier"] = report.get("hit_tier") or "miss"
        for key in ("prompt_tokens", "tokens_loaded", "tokens_from_prefix_cache"):
            row[key] = int(report.get(key) or 0)  # where the engine's prompt tokens came from
        stages = report.get("front_ms")
        row["overlap"] = report.get("miss_overlap")  # the engine started before the cascade
        row["held_media"] = report.get("held_media")  # media named by identity alone
        if isinstance(stages, dict):  # the front's own time on this request
            own = {k: float(v) for k, v in stages.items() if isinstance(v, (int, float))}
            ahead = {k: v for k, v in own.items() if k not in OVERLAPPED} \
                if row["overlap"] == "kept" else own  # what the engine's start waited for
            row["front_ms"], row["front_stages"] = float(sum(ahead.values())), own


#: The front's stages that run beside the engine's start when it keeps an overlapped call
#: (``miss_overlap``: ``kept``): not before it.
OVERLAPPED = ("wait_records", "cascade", "rewrite", "canonical_lookup")


def first_token_mark(chunk: dict[str, Any]) -> str | None:
    """Why ``chunk`` carries a generated token (``usage``, ``content``, ``finish``), or
    ``None``: the role chunk (usage 0, empty content) and a usage-only chunk do not."""
    choices = chunk.get("choices") or ()
    usage = chunk.get("usage")
    if choices and isinstance(usage, dict) and int(usage.get("completion_tokens") or 0) >= 1:
        return "usage"
    for choice in choices:
        if (choice.get("delta") or {}).get("content") or choice.get("text") \
                or choice.get("token_ids"):
            return "content"
        if choice.get("finish_reason"):
            return "finish"
    return None


async def run_phase(url: str, bodies: Sequence[dict[str, Any]], kinds: Sequence[str],
                    offsets: Sequence[float], drain_s: float) -> tuple[list[dict[str, Any]], float]:
    """Send ``bodies[i]`` at ``offsets[i]`` s; wait at most ``drain_s`` after the last
    arrival; requests still running then are cancelled (status -1). Returns the rows and
    the phase's wall time (first arrival to last completion)."""
    import httpx

    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=512)
    async with httpx.AsyncClient(base_url=url, timeout=drain_s + offsets[-1] + 60,
                                 limits=limits) as client:
        # written now: 200 KB of JSON a request would take the sending loop's time
        payloads = [json.dumps(body).encode() for body in bodies]
        start = time.perf_counter()
        tasks = []
        for i, (body, kind, at) in enumerate(zip(payloads, kinds, offsets)):
            delay = start + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(_send(client, i, body, kind)))
        done, pending = await asyncio.wait(tasks, timeout=drain_s)
        for task in pending:
            task.cancel()
        wall = time.perf_counter() - start
    rows = [t.result() for t in done]
    rows += [{"i": -1, "kind": "?", "status": -1, "ttft_ms": None, "e2e_ms": None,
              "tier": None, "tokens": 0, "error": "not finished within drain_s"}
             for _ in pending]
    return sorted(rows, key=lambda r: r["i"]), wall


async def oracle_phase(url: str, bodies: Sequence[dict[str, Any]], kinds: Sequence[str],
                       offsets: Sequence[float], drain_s: float, answered: Sequence[str]
                       ) -> tuple[list[dict[str, Any]], float]:
    """A perfect cache in front of plain vLLM, the ceiling any cache has on a trace: the
    requests of a kind in ``answered`` get their answer at once (TTFT and e2e 0, tier
    ``response``, ``oracle`` set), the rest go to the server at ``url`` at their own
    arrival times (tier ``miss``). Rows keep the trace's indices, as :func:`run_phase`'s."""
    sent = [i for i, kind in enumerate(kinds) if kind not in answered]
    rows: list[dict[str, Any]] = [
        {"i": i, "kind": kind, "status": 200, "ttft_ms": 0.0, "ttft_by": "oracle",
         "e2e_ms": 0.0, "tier": "response", "tokens": 0, "oracle": True}
        for i, kind in enumerate(kinds) if kind in answered]
    wall = max(offsets, default=0.0)
    if sent:
        engine_rows, wall = await run_phase(url, [bodies[i] for i in sent],
                                            [kinds[i] for i in sent],
                                            [offsets[i] for i in sent], drain_s)
        for row in engine_rows:
            row["tier"] = "miss" if row["status"] == 200 else None
            row["i"] = sent[row["i"]] if row["i"] >= 0 else -1
        rows += engine_rows
        wall = max(wall, max(offsets))  # the last instant answer may come after the rest
    return sorted(rows, key=lambda r: r["i"]), wall


def _pct(values: Sequence[float], q: float) -> float | None:
    return round(float(np.percentile(values, q)), 2) if len(values) else None


def summarize(rows: Sequence[dict[str, Any]], wall_s: float, slo: Slo,
              miss_ids: set[int] | None = None) -> dict[str, Any]:
    """Per-phase figures. ``throughput_rps``: answered requests / wall; ``goodput_rps``:
    requests meeting ``slo`` / wall. ``ttft_miss_p50_ms``: over rows whose tier is
    ``miss``, or (plain vLLM, no tiers) over the ids ``miss_ids`` that the cache missed on
    the same requests."""
    ok = [r for r in rows if r["status"] == 200 and r["ttft_ms"] is not None]
    good = [r for r in ok if slo.met(r)]
    ttft = [r["ttft_ms"] for r in ok]
    e2e = [r["e2e_ms"] for r in ok]
    if miss_ids is None:
        miss_rows = [r for r in ok if r["tier"] == "miss"]
    else:
        miss_rows = [r for r in ok if r["i"] in miss_ids]
    misses = [r["ttft_ms"] for r in miss_rows]
    hits: dict[str, int] = {}
    by_tier: dict[str, list[float]] = {}
    for r in ok:
        tier = r["tier"] or "engine"
        hits[tier] = hits.get(tier, 0) + 1
        by_tier.setdefault(tier, []).append(r["ttft_ms"])
    wall = max(wall_s, 1e-9)
    return {"requests": len(rows), "answered": len(ok), "errors": len(rows) - len(ok),
            "wall_s": round(wall_s, 2),
            "throughput_rps": round(len(ok) / wall, 3), "goodput_rps": round(len(good) / wall, 3),
            "slo_met_share": round(len(good) / max(len(rows), 1), 4),
            "ttft_p50_ms": _pct(ttft, 50), "ttft_p99_ms": _pct(ttft, 99),
            "ttft_by": dict(sorted(Counter(r.get("ttft_by") or "?" for r in ok).items())),
            "ttft_miss_p50_ms": _pct(misses, 50), "ttft_miss_n": len(misses),
            **miss_breakdown(miss_rows),
            "e2e_p50_ms": _pct(e2e, 50), "e2e_p99_ms": _pct(e2e, 99),
            "output_tokens": sum(int(r.get("tokens") or 0) for r in ok),
            "prompt_tokens": token_summary(ok),
            "hits_by_tier": dict(sorted(hits.items())),
            # a slow response-tier answer is the front's own queue, a slow miss may be either
            "ttft_by_tier_ms": {t: {"p50": _pct(v, 50), "p99": _pct(v, 99)}
                                for t, v in sorted(by_tier.items())},
            # every request whose engine call started before the cascade decided: kept as
            # its answer, or dropped (aborted) for a hit; misses' own in miss_overlap
            "overlaps": dict(sorted(Counter(str(r["overlap"]) for r in ok
                                            if r.get("overlap")).items())),
            # engine calls that named media vLLM holds by uuid alone, or resent them in full
            "held_media": dict(sorted(Counter(str(r["held_media"]) for r in ok
                                              if r.get("held_media")).items()))}


def miss_breakdown(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What a miss's TTFT is made of, where the rows say: the front's own time before the
    engine started (ours; the stages beside a kept overlapped call not counted; every
    stage's own time in ``miss_front_stages_ms``, the overlaps' outcomes in
    ``miss_overlap``) and the prompt tokens vLLM's prefix cache held (both arms, the same
    requests)."""
    front = [r["front_ms"] for r in rows if r.get("front_ms") is not None]
    cached = [r["cached_tokens"] for r in rows if r.get("cached_tokens") is not None]
    stages: dict[str, list[float]] = {}
    for r in rows:
        for k, v in (r.get("front_stages") or {}).items():
            stages.setdefault(k, []).append(v)
    return {"miss_front_ms_p50": _pct(front, 50), "miss_front_ms_p99": _pct(front, 99),
            "miss_front_stages_ms": {k: {"p50": _pct(v, 50), "p99": _pct(v, 99)}
                                     for k, v in sorted(stages.items())},
            "miss_overlap": dict(sorted(Counter(str(r.get("overlap")) for r in rows
                                                if "overlap" in r).items())),
            "miss_cached_tokens_mean": round(float(np.mean(cached)), 1) if cached else None}


def token_summary(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Where the answered requests' prompt tokens came from: ``total`` (as the usage says),
    ``response_tier`` (answered from a stored answer: no engine work at all),
    ``prefix_cache`` (vLLM's, both arms), ``loaded`` (vlmcache's KV tier), ``computed``
    (the rest: prefilled by the engine)."""
    total = sum(int(r.get("usage_prompt_tokens") or 0) for r in rows)
    stored = sum(int(r.get("usage_prompt_tokens") or 0) for r in rows
                 if r.get("tier") == "response")
    engine = [r for r in rows if r.get("tier") != "response"]
    loaded = sum(int(r.get("tokens_loaded") or 0) for r in engine)
    # vLLM's cached_tokens counts the connector's loaded tokens too: ours' report splits them
    cached = sum(int(r["tokens_from_prefix_cache"]) if "tokens_from_prefix_cache" in r else
                 max(0, int(r.get("cached_tokens") or 0) - int(r.get("tokens_loaded") or 0))
                 for r in engine)
    return {"total": total, "response_tier": stored, "prefix_cache": cached,
            "loaded": loaded, "computed": max(0, total - stored - cached - loaded)}


def miss_ids(rows: Sequence[dict[str, Any]]) -> set[int]:
    """Ids of the requests every vlmcache tier missed (answered by the engine)."""
    return {r["i"] for r in rows if r["status"] == 200 and r["tier"] == "miss"}


def verdict(rates: Sequence[dict[str, Any]], attained: float = 0.9) -> dict[str, Any]:
    """The issue's two serving targets over one shape's ``rates`` list, and the best goodput
    over the rates where at least ``attained`` of a side's requests met the SLO
    (``best_goodput_attained_rps``): past a side's knee its instant answers still count in
    its goodput while the rest time out, which that figure leaves out."""
    best = {side: max((r[side]["goodput_rps"] for r in rates), default=0.0)
            for side in ("ours", "plain")}
    held = {side: max((r[side]["goodput_rps"] for r in rates
                       if r[side]["slo_met_share"] >= attained), default=0.0)
            for side in ("ours", "plain")}
    low = min(rates, key=lambda r: r["rate"]) if rates else None
    ratio = None
    if low and low["ours"]["ttft_miss_p50_ms"] and low["plain"]["ttft_miss_p50_ms"]:
        ratio = round(low["ours"]["ttft_miss_p50_ms"] / low["plain"]["ttft_miss_p50_ms"], 3)
    gain = round(best["ours"] / best["plain"], 3) if best["plain"] else None
    return {"best_goodput_rps": best, "best_goodput_ratio": gain,
            "goodput_2x_met": bool(gain is not None and gain >= 2.0),
            "slo_attained_share": attained, "best_goodput_attained_rps": held,
            "best_goodput_attained_ratio":
                round(held["ours"] / held["plain"], 3) if held["plain"] else None,
            "lowest_rate_ttft_miss_ratio": ratio,
            "ttft_miss_1_05x_met": bool(ratio is not None and ratio <= 1.05)}
