"""Thresholds from a false-hit bound: per-tier curves measured offline, picked at run time.

The fidelity benchmark (``benchmarks/fidelity.py --calibration-out FILE``) measures, on
easy-vqa's *train* images (the evaluation uses the test images), for each calibrated
threshold a curve: at each candidate value, how many negatives (requests that must miss:
recoloured, mirrored, counted-differently images; questions with another meaning) would
hit, and how many positives would. A tier then considers the values whose 95% upper
confidence bound on the false-hit rate is at most ``max_false_hit_rate`` (so a small
calibration set cannot promise a bound it did not measure), as vCache does for
responses, and takes the one that keeps the most positives, each false hit counting as
``FALSE_HIT_COST`` lost positives (the most permissive among equals): the bound is a
ceiling, not a target, so a value further out is taken only where the positives it adds
pay for the false hits it adds. The file is JSON; vlmcache ships one measured by
its benchmark.

Curves: ``image_verify`` (verifier distance; a hit is ``distance <= t``, larger is more
permissive) and ``semantic_facet`` (cosine; a hit is ``cosine >= t``, smaller is more
permissive).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

SHIPPED = Path(__file__).with_name("calibration.json")
#: Used when a curve is missing or unreadable (the strict ends of the measured ranges).
FALLBACK = {"image_verify": 0.12, "semantic_facet": 0.85}
#: A calibration false hit (a wrong answer) weighs as much as this many lost positives
#: (recomputations) when a threshold is picked within the bound.
FALSE_HIT_COST = 10.0
#: Whether a larger threshold admits more hits.
LARGER_IS_PERMISSIVE = {"image_verify": True, "semantic_facet": False}


@dataclass(frozen=True)
class CurvePoint:
    """At ``threshold``: ``false_hits`` of ``negatives`` hit, ``hits`` of ``positives``."""

    threshold: float
    false_hits: int
    negatives: int
    hits: int
    positives: int

    @property
    def false_hit_bound(self) -> float:
        """One-sided 95% upper bound on the false-hit rate (exact for 0 false hits,
        Wilson score otherwise)."""
        n, k = self.negatives, self.false_hits
        if n == 0:
            return 1.0
        if k == 0:
            return 1.0 - 0.05 ** (1.0 / n)
        z, p = 1.645, k / n
        centre = p + z * z / (2 * n)
        spread = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
        return min(1.0, (centre + spread) / (1 + z * z / n))


def pick(curve: list[CurvePoint], max_false_hit_rate: float, name: str) -> float:
    """Among the thresholds of ``curve`` whose bound is within the rate, the one with the
    most ``hits - FALSE_HIT_COST * false_hits``; the most permissive among equals."""
    larger = LARGER_IS_PERMISSIVE[name]
    ok = [p for p in curve if p.false_hit_bound <= max_false_hit_rate]
    if not ok:
        logger.warning("calibration: no %s threshold keeps the false-hit rate under %.4f "
                       "(the calibration set is too small or too hard); using %.3f",
                       name, max_false_hit_rate, FALLBACK[name])
        return FALLBACK[name]
    permissive_first = sorted(ok, key=lambda p: p.threshold, reverse=larger)
    return max(permissive_first,
               key=lambda p: p.hits - FALSE_HIT_COST * p.false_hits).threshold


def load_curves(path: str | Path | None) -> dict[str, list[CurvePoint]]:
    """Curves by name from a calibration file (``None``: the shipped one); {} if unreadable."""
    path = Path(path) if path else SHIPPED
    try:
        data = json.loads(path.read_text())
        return {name: [CurvePoint(**point) for point in points]
                for name, points in data["curves"].items() if name in LARGER_IS_PERMISSIVE}
    except (OSError, ValueError, KeyError, TypeError) as exc:
        logger.warning("calibration file %s unreadable (%s): fallback thresholds", path, exc)
        return {}


def threshold(name: str, explicit: float | None, max_false_hit_rate: float,
              path: str | Path | None = None) -> float:
    """``explicit`` if set, else the calibrated threshold ``name`` for the bound."""
    if explicit is not None:
        return explicit
    curve = load_curves(path).get(name)
    if not curve:
        return FALLBACK[name]
    return pick(curve, max_false_hit_rate, name)


def write(path: str | Path, curves: dict[str, list[CurvePoint]], source: dict[str, object]) -> None:
    """Write a calibration file (curves plus how they were measured)."""
    data = {"format": "vlmcache-calibration-v1", "source": source,
            "curves": {name: [p.__dict__ for p in points] for name, points in curves.items()}}
    Path(path).write_text(json.dumps(data, indent=1) + "\n")
