"""Fidelity command pieces that need no engine: ground truth, probe sets, outcomes, targets."""

from __future__ import annotations

import easy_vqa
import numpy as np

from vlmcache_lab.fidelity import Row, build_probes, summarize, targets
from vlmcache_lab.fidelity_data import Probe, ShapeAttrs, answer, image_attrs, negate
from vlmcache_lab.fidelity_text import WIDE_PARAPHRASES, facet_changes, wide_paraphrase
from vlmcache_lab.fidelity_variants import MIRROR_MIN_OFFSET_PX, mirror, recolour_permute
from vlmcache.models.paraphrases import EVAL_PARAPHRASES, TEMPLATES, TRAIN_PARAPHRASES


def test_ground_truth_matches_easy_vqa():
    qs, ans, ids = easy_vqa.get_test_questions()
    attrs = image_attrs(qs, ans, ids)
    checked = [(q, a, i) for q, a, i in zip(qs, ans, ids) if i in attrs][:3000]
    assert len(checked) == 3000
    assert all(answer(q, attrs[i]) == a for q, a, i in checked)
    assert answer(negate("is there a red shape?"), ShapeAttrs("circle", "red")) == "no"


def test_wide_paraphrases_are_new_wordings_with_the_same_answer():
    seen = {w.lower() for table in (TRAIN_PARAPHRASES, EVAL_PARAPHRASES)
            for options in table.values() for w in options}
    assert set(WIDE_PARAPHRASES) == set(TEMPLATES)
    assert not {w.lower() for o in WIDE_PARAPHRASES.values() for w in o} & seen
    attrs = ShapeAttrs("circle", "red")
    for template in TEMPLATES:
        q = template.format(color="red", shape="circle")
        assert wide_paraphrase(q, 3) != q
    changed = facet_changes("is there a red shape?", 0)
    assert set(changed) == {"facet:negation", "facet:colour"}
    assert answer(changed["facet:colour"], attrs) == "no" == answer(changed["facet:negation"], attrs)


def test_probe_sets_cover_every_kind():
    seeds, probes = build_probes(6, seed=0)
    kinds = {p.category for p in probes}
    assert {"benign:jpeg_q35", "benign:noise_s6", "benign:brightness_15pct",
            "benign:shift_2_3px", "benign:rescale", "benign:video_frames",
            "hard:recolour_permute", "hard:recolour_hue", "hard:count_remove",
            "hard:count_add", "hard:other_same_template", "text:paraphrase",
            "facet:left_right", "facet:count"} <= kinds
    assert len(seeds) == 6 * 3 + 1 and all(p.source for p in seeds + probes)
    assert {p.gt for p in seeds + probes} <= set(easy_vqa.get_answers())


def test_hard_negatives_change_what_answers_hinge_on():
    qs, ans, ids = easy_vqa.get_test_questions()
    attrs = image_attrs(qs, ans, ids)
    paths = easy_vqa.get_test_image_paths()
    from PIL import Image

    rng = np.random.default_rng(0)
    mirrored = 0
    for i in sorted(attrs)[:30]:
        image = Image.open(paths[i]).convert("RGB")
        m = mirror(image, attrs[i], rng, "")
        if m is not None:
            mirrored += 1
            assert np.abs(np.asarray(m.image, float) - np.asarray(image, float)).max() > 100
        r = recolour_permute(image, attrs[i], rng, "")
        assert (r is None) == (attrs[i].color in ("black", "gray"))
    assert 0 < mirrored < 30 and MIRROR_MIN_OFFSET_PX == 8


def test_outcomes_and_targets():
    a = ShapeAttrs("circle", "red")
    ok = Probe("benign:noise_s6", None, "what color is the shape?", a, "x:n", True, source="x")
    bad = Probe("hard:recolour_permute", None, "is there a red shape?", a, "x:r", False,
                gt_override="no", source="x")
    para = Probe("text:paraphrase", None, "Which color does the shape have?", a, "x", True,
                 meaning="what color is the shape?", source="x")
    rows = [Row(ok, on="red", off="red", hit_tier="embedding:vision", canonical_image="x"),
            Row(bad, on="yes", off="no", hit_tier="embedding:vision", canonical_image="y"),
            Row(para, on="red", off="red", hit_tier="semantic_text",
                canonical_question="what color is the shape?")]
    variants = summarize(rows)
    assert variants["benign:noise_s6"] == {"n": 1, "right": 1, "other_image": 0, "miss": 0,
                                           "accuracy": 1.0, "accuracy_no_cache": 1.0}
    assert variants["hard:recolour_permute"]["other_image"] == 1
    assert variants["hard:recolour_permute"]["accuracy"] == 0.0
    t = targets(variants)
    assert not t["hard_negatives_zero"] and t["benign_all_at_least_95pct"]
    assert t["paraphrase_recall"] == 1.0 and t["other_image_rate"] == 0.5


def test_rows_round_trip_and_benign_family_counts_as_right():
    from vlmcache_lab.fidelity_summary import row_json as _row_json, rows_from_json

    a = ShapeAttrs("circle", "red")
    seed = Probe("seed", None, "what color is the shape?", a, "x", False, source="x")
    jpeg = Probe("benign:jpeg_q35", None, "what color is the shape?", a, "x:benign:jpeg_q35",
                 True, source="x")
    bright = Probe("benign:brightness_15pct", None, "what color is the shape?", a,
                   "x:benign:brightness_15pct", True, source="x")
    para = Probe("text:paraphrase", None, "Which color does the shape have?", a, "x", True,
                 meaning="what color is the shape?", source="x")
    rows = [Row(seed, on="red", off="red"), Row(jpeg, on="red", off="red"),
            Row(bright, on="red", off="red", hit_tier="embedding:vision",
                canonical_image="x:benign:jpeg_q35"),  # the jpeg copy became canonical
            Row(para, on="red", off="red", hit_tier="semantic_text",
                canonical_question="what color is the shape?")]
    back = rows_from_json([_row_json(r) for r in rows])
    variants = summarize(back)
    assert variants == summarize(rows)
    assert variants["benign:brightness_15pct"]["right"] == 1
    assert variants["text:paraphrase"]["right"] == 1
