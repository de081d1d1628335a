"""Answers of a serving run, checked: against a no-cache pass and easy-vqa's ground truth.

The no-cache pass sends every distinct request of the mix (question and image; the tenant
changes no answer) again with ``"vlmcache": {"bypass": true}``: the front skips every tier
and vLLM gets the request as sent. An answer equal to it is one the cache did not change;
``truth`` is easy-vqa's answer (compared after strip/lower, as ``scripts/eval_tiny_vqa.py``
does). :func:`compare_runs` matches two runs of one trace request by request.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any, Sequence

import numpy as np

from vlmcache_lab.serve_load import LoadRequest, run_load

AnswerKey = tuple[str, str]  # (question, image data URL)


def normalize(answer: object) -> str | None:
    """An answer as compared: stripped, lower case (``None`` stays ``None``)."""
    return answer.strip().lower() if isinstance(answer, str) else None


def distinct(mix: Sequence[LoadRequest]) -> list[LoadRequest]:
    """The distinct (question, image) requests of ``mix``, first occurrence kept, bypassing."""
    seen: dict[AnswerKey, LoadRequest] = {}
    for req in mix:
        seen.setdefault((req.question, req.image_url),
                        dataclasses.replace(req, kind="no_cache", bypass=True))
    return list(seen.values())


def no_cache_answers(url: str, model: str, mix: Sequence[LoadRequest],
                     concurrency: int) -> tuple[dict[AnswerKey, str | None], int]:
    """The no-cache answer of every distinct request of ``mix``, and how many failed."""
    reqs = distinct(mix)
    rows = asyncio.run(run_load(url, model, reqs, concurrency, 0))
    answers = {(reqs[r["i"]].question, reqs[r["i"]].image_url): r["answer"] for r in rows}
    return answers, sum(1 for r in rows if r["status"] != 200)


def tier_label(report: dict[str, Any] | None) -> str:
    """``miss``, the deciding tier, or ``response<-TIER`` for a canonical answer."""
    if not report:
        return "error"
    tier = report.get("hit_tier") or "miss"
    canonical = report.get("canonical_tier")
    return f"{tier}<-{canonical}" if canonical else tier


def compact_rows(rows: Sequence[dict[str, Any]],
                 mix: Sequence[LoadRequest]) -> list[dict[str, Any]]:
    """Per request: what the checks need (no images, no reports)."""
    return [{"i": r["i"], "kind": r["kind"], "status": r["status"],
             "e2e_ms": round(r["e2e_ms"], 3), "tier": tier_label(r["report"]),
             "answer": r["answer"], "truth": mix[r["i"]].truth,
             "key": [mix[r["i"]].question, image_id(mix[r["i"]].image_url)]} for r in rows]


def image_id(url: str) -> str:
    """A short stable id of an image data URL (rows and keys carry it, not the image)."""
    import hashlib

    return hashlib.sha256(url.encode()).hexdigest()[:16]


def check_answers(rows: Sequence[dict[str, Any]], mix: Sequence[LoadRequest],
                  reference: dict[AnswerKey, str | None]) -> dict[str, Any]:
    """Answers equal to the no-cache pass and to the ground truth: overall, per request
    kind and per deciding tier."""
    groups: dict[str, dict[str, dict[str, int]]] = {"by_kind": {}, "by_tier": {}}
    total = _counts()
    for r in rows:
        if r["status"] != 200:
            continue
        req = mix[r["i"]]
        got = normalize(r["answer"])
        same = got == normalize(reference.get((req.question, req.image_url)))
        right = req.truth is not None and got == normalize(req.truth)
        for bucket in (total, groups["by_kind"].setdefault(r["kind"], _counts()),
                       groups["by_tier"].setdefault(tier_label(r["report"]), _counts())):
            bucket["n"] += 1
            bucket["equal_to_no_cache"] += same
            bucket["equal_to_truth"] += right
    return {**total, **groups}


def _counts() -> dict[str, int]:
    return {"n": 0, "equal_to_no_cache": 0, "equal_to_truth": 0}


def latency_by(rows: Sequence[dict[str, Any]], field: str) -> dict[str, float]:
    """p50 end-to-end latency (ms) of the answered rows, per value of ``field``."""
    groups: dict[str, list[float]] = {}
    for r in rows:
        if r["status"] == 200:
            groups.setdefault(str(r[field]), []).append(r["e2e_ms"])
    return {k: round(float(np.percentile(v, 50)), 3) for k, v in sorted(groups.items())}


def compare_runs(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]],
                 examples: int = 20) -> dict[str, Any]:
    """Request-by-request comparison of two runs of one trace (compact rows)."""
    by_i = {r["i"]: r for r in b}
    pairs = [(x, by_i[x["i"]]) for x in a if x["i"] in by_i
             and x["status"] == 200 and by_i[x["i"]]["status"] == 200]
    differ = [(x, y) for x, y in pairs if normalize(x["answer"]) != normalize(y["answer"])]
    return {"compared": len(pairs), "same_answer": len(pairs) - len(differ),
            "different_answer": len(differ),
            "examples": [{"i": x["i"], "kind": x["kind"], "a": x["answer"], "b": y["answer"],
                          "tier_a": x["tier"], "tier_b": y["tier"], "truth": x["truth"]}
                         for x, y in differ[:examples]]}
