"""Outcomes, per-kind summaries and targets of the fidelity benchmark, and its rows as JSON.

Kinds: ``benign:*`` / ``hard:*`` (easy-vqa images), ``photo:benign_*`` /
``photo:hard_*`` (real photographs), ``video:benign_*`` / ``video:hard_*`` (clips through
the front's video path), ``text:*`` and ``facet:*`` (questions). Photographs and clips
have no ground truth (tiny-vqa answers easy-vqa questions; it reads no video): their
accuracies are ``None``.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Sequence

from vlmcache_lab.fidelity_data import Probe, ShapeAttrs

TEXT_TIERS = ("embedding:prompt", "semantic_text")
MEDIA_PREFIXES = ("benign", "hard", "photo:", "video:")
_NO_TRUTH = ("photo:", "video:")
_NO_TRUTH_ATTRS = ("photo", "video")  # the seeds of photographs and clips


@dataclass
class Row:
    """One probe's outcome."""

    probe: Probe
    on: str = ""
    off: str = ""
    hit_tier: str | None = None
    canonical_image: str | None = None  # the seed id (or probe id) it was mapped to
    canonical_question: str | None = None


def has_truth(probe: Probe) -> bool:
    """Whether easy-vqa's ground truth answers the probe (not a photograph's or clip's)."""
    return not probe.category.startswith(_NO_TRUTH) and probe.attrs.shape not in _NO_TRUTH_ATTRS


def is_benign(kind: str) -> bool:
    return kind.startswith(("benign", "photo:benign", "video:benign"))


def _same_picture(canonical: str, source: str) -> bool:
    """The source itself, or a benign variant of it that became canonical first."""
    return canonical in (source, f"{source}:video") or canonical.startswith(
        tuple(f"{source}:{p}" for p in ("benign:", "photo:benign_", "video:benign_")))


def outcome(row: Row) -> str:
    """right / other_image / miss of an image or video probe; right / other_question /
    miss of a text one."""
    p = row.probe
    if p.category.startswith(MEDIA_PREFIXES):
        if row.canonical_image is None:
            return "miss"
        return "right" if _same_picture(row.canonical_image, p.source) else "other_image"
    if row.hit_tier not in TEXT_TIERS:
        return "miss"
    return "right" if row.canonical_question == p.meaning else "other_question"


def summarize(rows: Sequence[Row]) -> dict[str, dict[str, Any]]:
    """Per variant kind: n, right, other_image (or other_question), miss, accuracies."""
    groups: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        if row.probe.category != "seed":
            groups[row.probe.category].append(row)
    out = {}
    for kind, group in sorted(groups.items()):
        counts: dict[str, int] = defaultdict(int)
        for r in group:
            counts[outcome(r)] += 1
        truth = not kind.startswith(_NO_TRUTH)
        out[kind] = {"n": len(group), "right": counts["right"],
                     "other_image" if kind.startswith(MEDIA_PREFIXES) else
                     "other_question": counts["other_image"] + counts["other_question"],
                     "miss": counts["miss"],
                     "accuracy": _mean([r.on == r.probe.gt for r in group]) if truth else None,
                     "accuracy_no_cache": _mean([r.off == r.probe.gt for r in group])
                     if truth else None}
    return out


def _hits_and_rates(variants: dict[str, dict[str, Any]], prefix: str,
                    hard_words: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """(false hits per hard kind, right rate per benign kind) of the kinds under ``prefix``."""
    kinds = {k: v for k, v in variants.items() if k.startswith(prefix)}
    hard = {k: v["right"] + v["other_image"] for k, v in kinds.items()
            if "hard" in k and (not hard_words or any(w in k for w in hard_words))}
    benign = {k: round(v["right"] / v["n"], 4) for k, v in kinds.items() if is_benign(k)}
    return hard, benign


def targets(variants: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The done-when checks, measured: image hard negatives (recolour, mirror, count; on
    easy-vqa and photographs) 0 false hits, benign kinds >= 95% right; the same for video."""
    hard, benign = _hits_and_rates(variants, "", ("recolour", "mirror", "count"))
    hard = {k: v for k, v in hard.items() if not k.startswith("video:")}
    benign = {k: v for k, v in benign.items() if k.startswith("benign")}
    _, photo_benign = _hits_and_rates(variants, "photo:")
    video_hard, video_benign = _hits_and_rates(variants, "video:")
    image = {k: v for k, v in variants.items() if k.startswith(("benign", "hard", "photo:"))}
    n = sum(v["n"] for v in image.values())
    other = sum(v["other_image"] for v in image.values())
    para = variants.get("text:paraphrase", {"n": 0, "right": 0})
    facet = sum(v["right"] + v["other_question"] for k, v in variants.items()
                if k.startswith("facet"))
    return {"hard_negative_hits": hard, "hard_negatives_zero": all(v == 0 for v in hard.values()),
            "benign_right_rate": benign,
            "benign_all_at_least_95pct": all(v >= 0.95 for v in benign.values()),
            "photo_benign_right_rate": photo_benign,
            "photo_benign_all_at_least_95pct": all(v >= 0.95 for v in photo_benign.values()),
            "video_hard_negative_hits": video_hard,
            "video_hard_negatives_zero": all(v == 0 for v in video_hard.values()),
            "video_benign_right_rate": video_benign,
            "video_benign_all_at_least_95pct": all(v >= 0.95 for v in video_benign.values()),
            "other_image_rate": round(other / n, 4) if n else None,
            "paraphrase_recall": round(para["right"] / para["n"], 4) if para["n"] else None,
            "facet_false_hits": facet}


def _mean(values: Sequence[bool]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def row_json(row: Row) -> dict[str, Any]:
    """One row as the results file keeps it."""
    return {"kind": row.probe.category, "image": row.probe.image_id,
            "source": row.probe.source, "question": row.probe.question,
            "gt": row.probe.gt if has_truth(row.probe) else None,
            "on": row.on, "off": row.off, "hit_tier": row.hit_tier,
            "canonical_image": row.canonical_image,
            "canonical_question": row.canonical_question, "meaning": row.probe.meaning,
            "outcome": outcome(row) if row.probe.category != "seed" else None}


def rows_from_json(rows: Sequence[dict[str, Any]]) -> list[Row]:
    """Rows of a results file, back as :class:`Row` objects (for ``--resummarize``)."""
    attrs = ShapeAttrs("", "")
    first_seed: dict[str, str] = {}  # files without "meaning": a paraphrase rewords the
    for r in rows:                   # first seed question of its image (build_probes)
        if r["kind"] == "seed":
            first_seed.setdefault(r["source"], r["question"])
    return [Row(Probe(r["kind"], None, r["question"], attrs, r["image"],
                      is_benign(r["kind"]) or r["kind"].startswith("text"),
                      meaning=r.get("meaning") or (first_seed.get(r["source"], "")
                                                   if r["kind"] == "text:paraphrase" else ""),
                      gt_override=r["gt"] or "", source=r["source"]),
                on=r["on"], off=r["off"], hit_tier=r["hit_tier"],
                canonical_image=r["canonical_image"],
                canonical_question=r["canonical_question"]) for r in rows]
