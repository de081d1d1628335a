"""One request's way through the front (:class:`FrontPlan`) and how its report is told:
the body's ``vlmcache`` field, the report of a stored answer, the field an error names."""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any

from vlmcache.cascade import RESPONSE_TIER, Resolution, TierStatus
from vlmcache.errors import RequestError
from vlmcache.report import ReuseReport
from vlmcache.serving.openai_req import ParsedRequest


@dataclass
class FrontPlan:
    """One request between :meth:`CascadeFront.begin` and :meth:`CascadeFront.finish`."""

    request: ParsedRequest
    resolution: Resolution | None
    response_key: str | None
    response_status: TierStatus
    cached: dict[str, Any] | None
    forward: dict[str, Any] | None
    started: float
    stages: dict[str, float] = field(default_factory=dict)
    #: The response-tier key of the canonical request (``response_after_canonical``), when
    #: the cascade rewrote this one; ``cached`` came from it if it is set and not ``None``.
    canonical_key: str | None = None
    #: The body forwarded if the cascade finds nothing, when the engine call was started on
    #: it before the cascade ran (``prepare(overlap=True)``); ``overlap``: whether that call
    #: was ``"kept"`` as the answer or ``"dropped"`` for the cascade's choice.
    miss_forward: dict[str, Any] | None = None
    overlap: str | None = None
    #: ``"elided"`` when the engine got the media it holds by identity alone, ``"resent"``
    #: when it refused that and got them in full (:mod:`vlmcache.serving.held_media`).
    held_media: str | None = None


def cached_report(plan: FrontPlan, body: dict[str, Any]) -> ReuseReport:
    """The report of a response-tier hit; one found under the canonical key also says how
    the cascade got there (its statuses, tier, score, canonical text and images)."""
    req = plan.request
    usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
    report = ReuseReport(
        request_id=body["id"], hit_tier=RESPONSE_TIER, statuses={RESPONSE_TIER: "hit"},
        similarity=1.0, canonical_prompt=None,
        prompt_tokens=int(usage.get("prompt_tokens") or 0), tokens_loaded=0,
        tokens_from_prefix_cache=0, tokens_computed=0, blocks_saved=0,
        load_failed_blocks=0, latency_s=time.perf_counter() - plan.started,
        videos=req.video_hashes, video_frames=req.video_frames)
    res = plan.resolution
    if plan.canonical_key is None or res is None:
        return report
    rw = res.rewrite
    images = rw is not None and res.images is not None  # the canonical pixels were sent
    return dataclasses.replace(
        report, statuses={RESPONSE_TIER: "hit", **res.statuses}, similarity=res.similarity,
        canonical_prompt=res.matched.canonical_prompt if res.matched else None,
        canonical_question=rw.canonical_question if rw is not None else None,
        canonical_images=rw.canonical_images if rw is not None and images else (),
        image_similarity=rw.image_scores if rw is not None and images else (),
        videos=res.video_hashes or req.video_hashes, canonical_tier=res.hit_tier)


def report_body(plan: FrontPlan, report: ReuseReport) -> dict[str, Any]:
    """The report as the response carries it: :meth:`ReuseReport.to_dict` plus the
    front's own time per stage (``front_ms``), where the engine call started while the
    cascade looked, whether it was kept (``miss_overlap``), and where media went to the
    engine by identity alone, how that went (``held_media``)."""
    body = {**report.to_dict(),
            "front_ms": {k: round(v * 1000, 4) for k, v in plan.stages.items()}}
    if plan.overlap is not None:  # the engine started before the cascade decided
        body["miss_overlap"] = plan.overlap
    if plan.held_media is not None:
        body["held_media"] = plan.held_media
    return body


def error_field(error: RequestError) -> str:
    """The field a :class:`RequestError` names (its message starts ``field: ...``)."""
    head = str(error).split(":", 1)[0]
    return head if head and " " not in head else "request"
