"""Fidelity command pieces that need no engine: ground truth, probe sets, metrics, sweep."""

from __future__ import annotations

import easy_vqa

from vlmcache.bench.fidelity import THRESHOLDS, Row, build_probes, summarize, sweep
from vlmcache.bench.fidelity_data import ShapeAttrs, answer, image_attrs, negate


def test_ground_truth_matches_easy_vqa():
    qs, ans, ids = easy_vqa.get_test_questions()
    attrs = image_attrs(qs, ans, ids)
    checked = [(q, a, i) for q, a, i in zip(qs, ans, ids) if i in attrs][:3000]
    assert len(checked) == 3000
    assert all(answer(q, attrs[i]) == a for q, a, i in checked)
    red_circle = ShapeAttrs("circle", "red")
    assert answer(negate("is there a red shape?"), red_circle) == "no"


def test_probe_sets_cover_every_category():
    seeds, probes = build_probes(4, seed=0)
    cats = {p.category for p in probes}
    assert {"paraphrase", "near_dup:shifted", "near_dup:noised", "near_dup:jpeg", "video",
            "other_image"} <= cats
    assert len(seeds) == 5 and all(p.image.size == (64, 64) for p in probes)
    assert {p.gt for p in seeds + probes} <= set(easy_vqa.get_answers())


def test_metrics_and_sweep():
    a = ShapeAttrs("circle", "red")
    from vlmcache.bench.fidelity_data import Probe

    para = Probe("paraphrase", None, "what color is the shape?", a, "x", True)
    neg = Probe("negated", None, "is there not a red shape?", a, "x", False)
    rows = [Row(para, on="red", off="red", hit_tier="semantic_text", canonical_gt="red",
                scores={"text": 0.9}, sweep_answer="red", sweep_gt="red"),
            Row(neg, on="no", off="no", canonical_gt="no", scores={"text": 0.95},
                sweep_answer="yes", sweep_gt="yes", gated=True)]
    summary = summarize(rows)
    text = summary["semantic_text"]
    assert text["hit_rate"] == 1.0 and text["false_hit_rate"] == 0.0
    assert text["accuracy"] == 1.0 and text["agreement_with_no_cache"] == 1.0
    curves = sweep(rows)
    at = {c["threshold"]: c for c in curves["semantic_text"]}
    ungated = {c["threshold"]: c for c in curves["semantic_text:no_gate"]}
    assert at[0.85]["false_hit_rate"] == 0.0 and ungated[0.85]["false_hit_rate"] == 0.5
    assert ungated[0.85]["accuracy"] == 0.5 and at[0.95]["hit_rate"] == 0.0
    assert len(curves["embedding:vision"]) == len(THRESHOLDS)
