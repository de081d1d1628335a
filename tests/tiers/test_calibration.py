"""Thresholds from a false-hit bound."""

from __future__ import annotations

import json

import pytest

from vlmcache.tiers import calibration
from vlmcache.tiers.calibration import CurvePoint, pick


def test_bound_is_exact_for_zero_and_grows_with_false_hits():
    assert CurvePoint(0.1, 0, 299, 0, 0).false_hit_bound == pytest.approx(0.00997, abs=1e-4)
    assert CurvePoint(0.1, 0, 100, 0, 0).false_hit_bound > 0.01  # too few negatives
    assert CurvePoint(0.1, 5, 1000, 0, 0).false_hit_bound > 0.005
    assert CurvePoint(0.1, 0, 0, 0, 0).false_hit_bound == 1.0


def test_pick_within_bound_per_direction():
    # 0.2 keeps 50 more positives for its 3 false hits; 0.3 is outside the bound
    dist = [CurvePoint(t, k, 1000, h, 900) for t, k, h in
            ((0.1, 0, 800), (0.2, 3, 850), (0.3, 40, 899))]
    assert pick(dist, 0.01, "image_verify") == 0.2
    assert pick(dist, 0.001, "image_verify") == calibration.FALLBACK["image_verify"]
    cos = [CurvePoint(t, k, 1000, h, 900) for t, k, h in
           ((0.7, 30, 899), (0.8, 2, 850), (0.9, 0, 800))]
    assert pick(cos, 0.01, "semantic_facet") == 0.8


def test_pick_stops_where_false_hits_buy_too_little():
    """Within the bound, a threshold further out is taken only where the positives it
    adds pay for its false hits (``FALSE_HIT_COST`` each); among equals, the most
    permissive."""
    dist = [CurvePoint(t, k, 1000, h, 900) for t, k, h in
            ((0.1, 0, 800), (0.2, 0, 850), (0.25, 0, 850), (0.3, 3, 852))]
    assert pick(dist, 0.01, "image_verify") == 0.25
    cos = [CurvePoint(t, k, 1000, h, 900) for t, k, h in
           ((0.7, 1, 855), (0.8, 0, 850), (0.9, 0, 850))]
    assert pick(cos, 0.01, "semantic_facet") == 0.8


def test_threshold_explicit_file_and_shipped(tmp_path):
    assert calibration.threshold("image_verify", 0.3, 0.01) == 0.3
    path = tmp_path / "cal.json"
    calibration.write(path, {"image_verify": [CurvePoint(0.2, 0, 5000, 9, 10)]}, {"by": "test"})
    assert json.loads(path.read_text())["source"] == {"by": "test"}
    assert calibration.threshold("image_verify", None, 0.01, path) == 0.2
    assert calibration.threshold("semantic_facet", None, 0.01, path) == 0.85  # no curve
    (tmp_path / "bad.json").write_text("{")
    assert calibration.threshold("image_verify", None, 0.01, tmp_path / "bad.json") == 0.12
    shipped = calibration.load_curves(None)
    assert set(shipped) == {"image_verify", "semantic_facet"}
    assert 0.05 <= calibration.threshold("image_verify", None, 0.01) <= 0.4
