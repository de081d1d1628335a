"""The GPU benchmark's per-engine helpers that need no engine."""

import time

from vlmcache_lab.gpu_runner import _SpanTimed, _timed_summary, _token_summary


class _LLM:
    name = "fake"

    def generate(self, prompts, params, use_tqdm=False):
        time.sleep(0.01)
        return ["out"]


def test_span_timed_notes_the_engine_call_and_passes_everything_through():
    span = [0.0, 0.0]
    llm = _SpanTimed(_LLM(), span)
    before = time.perf_counter()
    assert llm.generate(["p"], None, use_tqdm=False) == ["out"]
    after = time.perf_counter()
    assert before <= span[0] < span[1] <= after and span[1] - span[0] >= 0.01
    assert llm.name == "fake"


def test_token_summary_reports_vlmcache_share_of_front_and_return():
    facts = [{"prompt": 680, "loaded": 672, "prefix": 0, "stored": 0, "choice": None,
              "reason": None, "front_ms": 5.0, "queue_ms": 14.0, "engine_ms": 20.0,
              "return_ms": 1.7, "ours_front_ms": 0.4, "ours_return_ms": 0.2}]
    s = _token_summary(facts)
    assert s["tokens_computed"] == 8
    assert s["ours_front_median_ms"] == 0.4 and s["ours_return_median_ms"] == 0.2
    assert s["front_median_ms"] == 5.0


def test_ab_mode_sends_each_request_both_ways_taking_turns_at_going_first():
    from vlmcache_lab.gpu_runner import Runner
    from vlmcache_lab.turns import Turns

    runner = object.__new__(Runner)  # the engine-free parts of a vlmcache_ab runner
    runner.turns, runner.ab, runner.plain_facts = Turns("", "x", []), True, []
    runner.side, runner.params, runner.plain_only = 8, None, False
    order = []
    timing = {"front_ms": 3.0, "queue_ms": 0.0, "engine_ms": 9.0, "return_ms": 1.0}

    def via_cached(images, params):
        order.append("cached")
        return [{"wall_s": 0.015, "prompt": 680, "loaded": 0, "prefix": 672, "stored": 0,
                 "choice": None, "reason": None, **timing}]

    def plain(images, params):
        order.append("plain")
        return [{"wall_s": 0.013, "prompt": 680, "cached": 672, **timing}]

    runner._generate, runner._plain = via_cached, plain
    out = runner.timed([1, 2, 3, 4])
    assert order == ["cached", "plain", "plain", "cached"] * 2
    assert out["median_ms"] == 15.0 and out["tokens_from_prefix_cache"] == 672
    assert out["plain"]["median_ms"] == 13.0 and out["plain"]["tokens_cached"] == 672
    assert len(out["plain"]["all_ms"]) == 4


def test_plain_only_mode_sends_plain_requests_to_vlmcaches_engine():
    from vlmcache_lab.gpu_runner import Runner
    from vlmcache_lab.turns import Turns

    runner = object.__new__(Runner)  # a vlmcache_plain runner, engine-free
    runner.turns, runner.ab, runner.plain_facts = Turns("", "x", []), False, []
    runner.side, runner.params, runner.plain_only = 8, None, True
    order = []
    timing = {"front_ms": 3.0, "queue_ms": 0.0, "engine_ms": 9.0, "return_ms": 1.0}
    runner._generate = lambda images, params: order.append("cached") or []
    runner._plain = lambda images, params: order.append("plain") or [
        {"wall_s": 0.013, "prompt": 680, "cached": 672, **timing}]
    out = runner.timed([1, 2])
    assert order == ["plain", "plain"] and out["tokens_cached"] == 672
    assert all("core" in p for p in out["phases_ms"])  # where its engine's thread ran


def test_timed_summary_keeps_each_requests_turn_place_and_medians_per_place():
    facts = [{"prompt": 665, "cached": 656, "front_ms": 5.0, "queue_ms": 0.1,
              "engine_ms": e, "return_ms": 1.0, "core": 3, "place": p}
             for e, p in ((10.0, 0), (11.0, 1), (14.0, 2), (12.0, 0))]
    s = _timed_summary([17.0, 18.0, 21.0, 19.0], facts)
    assert [f["place"] for f in s["phases_ms"]] == [0, 1, 2, 0]
    assert s["by_place_ms"] == {"0": [18.0, 2], "1": [18.0, 1], "2": [21.0, 1]}
