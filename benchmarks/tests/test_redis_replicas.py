"""The two-replica run's counting (the engine run itself is benchmarks/redis_replicas.py)."""

from __future__ import annotations

from vlmcache_lab.redis_replicas import ReplicaRun, _tally, result_dict


def test_tally_counts_errors_reuse_and_agreement():
    res = ReplicaRun()
    first = _tally(res, "A", [{"seed": 0, "token_ids": [1, 2], "hit_tier": None,
                               "tokens_loaded": 0},
                              {"seed": 1, "error": "boom"}], None)
    assert first == {0: [1, 2], 1: None} and res.errors == 1
    reused = _tally(res, "B", [{"seed": 0, "token_ids": [1, 2], "hit_tier": "text:exact",
                                "tokens_loaded": 64},
                               {"seed": 1, "token_ids": [3], "hit_tier": None,
                                "tokens_loaded": 0},
                               {"seed": 2, "token_ids": [], "hit_tier": None,
                                "tokens_loaded": 0}], first)
    assert reused == 1 and res.errors == 2 and res.requests == 5
    assert res.shared_kv_tokens_loaded == 64 and res.shared_kv_hits == 1
    assert (res.compared, res.same_output_as_first_replica) == (1, 1)
    assert all("token_ids" not in r for r in result_dict(res)["rows"])


def test_three_steps_order_outage_and_counts():
    from vlmcache_lab.redis_replicas import OUTAGE, PHASE_1, PHASE_3, three_steps

    events: list = []

    class Server:
        def kill(self):
            events.append("kill")

        def start(self):
            events.append("start")

    def asker(who):
        def ask(seeds):
            events.append((who, tuple(seeds)))
            return [{"seed": s} for s in seeds]
        return ask

    def tally(who, rows, first):
        if first is None:
            return {r["seed"]: who for r in rows}
        assert set(first) == {r["seed"] for r in rows}  # B gets what A answered
        return len(rows)

    shared, after, outage = three_steps(asker("a"), asker("b"), Server(), tally, 0.0)
    assert (shared, after, outage) == (len(PHASE_1) + len(PHASE_3), len(PHASE_3), 2 * len(OUTAGE))
    assert events == [("a", PHASE_1), ("b", PHASE_1), "kill", ("a", OUTAGE), ("b", OUTAGE),
                      "start", ("a", PHASE_3), ("b", PHASE_3)]
