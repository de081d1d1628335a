"""Splitting a request's time into phases from vLLM's engine timestamps."""

from types import SimpleNamespace

from vlmcache_lab.phase_timing import phase_medians, phases


def _out(queued, sched, last):
    return SimpleNamespace(metrics=SimpleNamespace(queued_ts=queued, scheduled_ts=sched,
                                                   last_token_ts=last))


def test_phases_add_up_to_the_call():
    p = phases(_out(10.002, 10.003, 10.050), start=10.0, end=10.051)
    assert round(p["front_ms"], 3) == 2.0 and round(p["queue_ms"], 3) == 1.0
    assert round(p["engine_ms"], 3) == 47.0 and round(p["return_ms"], 3) == 1.0
    assert round(sum(p.values()), 3) == 51.0


def test_missing_or_inconsistent_timestamps_give_no_phases():
    assert phases(SimpleNamespace(metrics=None), 1.0, 2.0) == {}
    assert phases(_out(0.5, 1.1, 1.2), start=1.0, end=2.0) == {}  # before the call
    assert phase_medians([{"prompt": 3}]) == {}


def test_medians_per_phase():
    facts = [phases(_out(1.0 + i, 1.001 + i, 1.01 + i), i + 0.999, i + 1.011) for i in range(3)]
    med = phase_medians(facts)
    assert set(med) == {"front_median_ms", "queue_median_ms", "engine_median_ms",
                        "return_median_ms"}
    assert med["engine_median_ms"] == 9.0
