"""The serving benchmark's request mix and summary (no server)."""

from collections import Counter

from vlmcache_lab.serve_load import build_mix, idle_summary, summarize


def test_mix_has_every_kind_after_the_first_asks():
    mix = build_mix(300, pool=20)
    assert len(mix) == 300 and all(r.kind == "first" for r in mix[:20])
    kinds = Counter(r.kind for r in mix[20:])
    assert set(kinds) == {"repeat", "spacing", "paraphrase", "near_duplicate", "other_tenant"}
    assert {r.tenant for r in mix} == {"tenant-a", "tenant-b"}
    firsts = {(r.question, r.image_url) for r in mix[:20]}
    assert all((r.question, r.image_url) in firsts for r in mix if r.kind == "repeat")
    assert all(r.image_url.startswith("data:image/jpeg") for r in mix
               if r.kind == "near_duplicate")


def _row(tier, e2e, front, status=200):
    report = {"hit_tier": tier, "latency_s": e2e / 2000, "front_ms": front}
    return {"i": 0, "kind": "k", "tenant": "t", "status": status, "e2e_ms": e2e,
            "report": report if status == 200 else None, "answer": None}


def test_summary_counts_errors_tiers_and_stage_medians():
    rows = [_row(None, 100, {"decode": 1, "cascade": 3}), _row(None, 300, {"decode": 3,
                                                                          "cascade": 5}),
            _row("response", 4, {"decode": 1}), _row("text:exact", 50, {}),
            _row(None, 1, {}, status=500)]
    s = summarize(rows)
    assert s["requests"] == 5 and s["errors"] == 1
    assert s["hits_by_tier"] == {"miss": 2, "response": 1, "text:exact": 1}
    assert s["miss_overhead_ms_p50"] == {"cascade": 4.0, "decode": 2.0, "total": 6.0}
    assert s["response_hit_ms_p50"] == {"server": 2.0, "end_to_end": 4.0}
    idle = idle_summary(rows[2:3], rows[:2])
    assert idle["response_hit_ms_p50"]["end_to_end"] == 4.0
    assert idle["probes"]["errors"] == 0


def test_every_request_carries_its_ground_truth_and_a_bypass_body_skips_the_cache():
    import dataclasses

    mix = build_mix(80, pool=10)
    assert all(r.truth for r in mix)
    firsts = {(r.question, r.image_url): r.truth for r in mix[:10]}
    assert all(firsts[(r.question.strip().lower(), r.image_url)] == r.truth for r in mix
               if r.kind in ("repeat", "spacing", "other_tenant"))  # a variant keeps its truth
    first = mix[0]
    assert "vlmcache" not in first.body("m")
    assert dataclasses.replace(first, bypass=True).body("m")["vlmcache"] == {"bypass": True}


def test_config_overrides_parse_json_values_and_refuse_a_bare_key():
    import pytest

    from vlmcache_lab.serve_load import config_overrides

    assert config_overrides(["response_after_canonical=true", "image_embedder=phash",
                             "image_threshold=0.7"]) == {
        "response_after_canonical": True, "image_embedder": "phash", "image_threshold": 0.7}
    with pytest.raises(SystemExit):
        config_overrides(["response_after_canonical"])


def _answered(i, kind, answer, tier="miss", canonical=None):
    report = {"hit_tier": tier, "canonical_tier": canonical}
    return {"i": i, "kind": kind, "status": 200, "e2e_ms": 10.0 * (i + 1), "report": report,
            "answer": answer}


def test_answers_are_checked_against_the_no_cache_pass_and_the_truth():
    from vlmcache_lab.answer_check import check_answers, distinct, tier_label
    from vlmcache_lab.serve_load import LoadRequest

    mix = [LoadRequest("first", "a", "q1", "img1", "yes"),
           LoadRequest("spacing", "a", " Q1 ", "img1", "yes"),
           LoadRequest("other_tenant", "b", "q1", "img1", "yes")]
    assert [(r.question, r.bypass) for r in distinct(mix)] == [("q1", True), (" Q1 ", True)]
    reference = {("q1", "img1"): "yes", (" Q1 ", "img1"): "no"}  # the engine on " Q1 "
    rows = [_answered(0, "first", "Yes "), _answered(1, "spacing", "yes", "response",
                                                     "text:exact"),
            {**_answered(2, "other_tenant", None), "status": 500, "report": None}]
    out = check_answers(rows, mix, reference)
    assert (out["n"], out["equal_to_no_cache"], out["equal_to_truth"]) == (2, 1, 2)
    assert out["by_tier"]["response<-text:exact"] == {"n": 1, "equal_to_no_cache": 0,
                                                      "equal_to_truth": 1}
    assert tier_label(None) == "error" and tier_label({"hit_tier": None}) == "miss"


def test_two_runs_are_compared_request_by_request():
    from vlmcache_lab.answer_check import compact_rows, compare_runs
    from vlmcache_lab.serve_load import LoadRequest

    mix = [LoadRequest("first", "a", "q", "img", "red")] * 3
    a = compact_rows([_answered(0, "first", "red"), _answered(1, "first", "red"),
                      _answered(2, "first", "red")], mix)
    b = compact_rows([_answered(0, "first", "Red"), _answered(1, "first", "blue",
                                                              "response", "text:exact"),
                      {**_answered(2, "first", None), "status": -1}], mix)
    vs = compare_runs(a, b)
    assert (vs["compared"], vs["same_answer"], vs["different_answer"]) == (2, 1, 1)
    assert vs["examples"][0]["tier_b"] == "response<-text:exact"
