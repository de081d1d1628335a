"""The replicas benchmark's pure parts (issue 35): arms' traces, reuse sources, verdict."""

from __future__ import annotations

from vlmcache_lab.replicas_gpu import (ARMS, arm_trace, parse_args, reuse_source,
                                       reuse_summary, routing_delta, verdict)
from vlmcache_lab.serve_gpu_trace import build_trace


def row(tier=None, prompt=600, loaded=0, prefix=0, status=200):
    return {"status": status, "tier": tier, "prompt_tokens": prompt, "tokens_loaded": loaded,
            "tokens_from_prefix_cache": prefix}


def test_each_arm_gets_the_same_trace_under_its_own_tenants():
    trace = build_trace(40, seed=3)
    arms = {arm: arm_trace(trace, arm) for arm in ARMS}
    for arm, reqs in arms.items():
        assert [(r.kind, r.image, r.question) for r in reqs] == \
            [(r.kind, r.image, r.question) for r in trace]
        assert {r.tenant for r in reqs} == {f"{arm}-{t}" for t in {r.tenant for r in trace}}
    assert not {r.tenant for r in arms["single"]} & {r.tenant for r in arms["affinity"]}


def test_reuse_source_names_what_served_a_request():
    assert reuse_source(row("response")) == "response"
    assert reuse_source(row("embedding:vision", prefix=580)) == "embedding:vision"
    assert reuse_source(row("kv", loaded=576)) == "kv"
    assert reuse_source(row("miss", prefix=576)) == "prefix_cache"
    assert reuse_source(row(None, prefix=16)) == "miss"  # a template block is no hit
    assert reuse_source(row("miss", prompt=0)) == "miss"


def test_reuse_summary_counts_hits_and_token_shares_over_engine_requests():
    rows = [row("response", prompt=0), row("miss", prefix=600), row("kv", loaded=300),
            row("miss"), row(status=-1)]
    s = reuse_summary(rows)
    assert s["hits_by_source"] == {"kv": 1, "miss": 1, "prefix_cache": 1, "response": 1}
    assert s["hit_rate"] == 0.75 and s["front_hit_rate"] == 0.25
    assert s["engine_requests"] == 3 and s["engine_prompt_tokens"] == 1800
    assert s["prefix_cache_token_share"] == round(600 / 1800, 4)
    assert s["kv_loaded_token_share"] == round(300 / 1800, 4)
    assert reuse_summary([])["hit_rate"] is None


def test_verdict_compares_affinity_with_the_single_replica():
    def arm(name, rate):
        return {"arm": name, "reuse": {"hit_rate": rate},
                "load": {"goodput_rps": 1.0, "ttft_p99_ms": 9.0}}

    v = verdict([arm("single", 0.6), arm("round_robin", 0.4), arm("affinity", 0.6)])
    assert v["affinity_hit_rate_ge_single"] is True
    assert v["hit_rate"] == {"single": 0.6, "round_robin": 0.4, "affinity": 0.6}
    assert verdict([arm("single", 0.6), arm("affinity", 0.5)])[
        "affinity_hit_rate_ge_single"] is False


def test_smoke_and_gpu_defaults():
    smoke = parse_args(["--smoke"])
    assert smoke.rate == 0.5 and smoke.max_model_len == 1024 and smoke.geometry is None
    gpu = parse_args(["--geometry", "g", "--gpus", "0,1", "--rate", "20"])
    assert gpu.rate == 20 and gpu.phase_s == 30 and gpu.gpu_memory_utilization == 0.8


def test_tp_restart_judges_full_loads_and_the_other_namespace():
    from vlmcache_lab.tp_restart import loadable, parse_args, phase_summary
    from vlmcache_lab.tp_restart import verdict as tp_verdict

    assert loadable(680, 16) == 672 and loadable(673, 16) == 672 and loadable(0, 16) == 0

    def r(loaded, prompt=680, saved=0):
        return {"prompt_tokens": prompt, "tokens_loaded": loaded,
                "tokens_from_prefix_cache": 0, "blocks_saved": saved}

    first = {**phase_summary([r(0, saved=42), r(0, saved=42)], 16), "tokens_stored": 1344}
    assert first["blocks_saved_reported"] == 84 and not first["all_loaded_in_full"]
    again = phase_summary([r(672), r(672)], 16)
    partial = phase_summary([r(672), r(640)], 16)
    other = phase_summary([r(0), r(0)], 16)
    assert again["all_loaded_in_full"] and not partial["all_loaded_in_full"]
    v = tp_verdict({"first": first, "restart": again, "other_tp": other})
    assert v == {"restart_loads_in_full": True, "other_tp_loads_zero": True,
                 "first_stored_tokens": 1344}
    failed = phase_summary([{"k": -1, "error": "x"}], 16)
    assert not tp_verdict({"first": first, "restart": failed, "other_tp": failed})[
        "other_tp_loads_zero"]
    assert parse_args(["--smoke"]).tp == 1 and parse_args(["--geometry", "g"]).tp == 2


def test_routing_counts_are_per_arm():
    before = {"policy": "affinity", "chosen": [4, 0], "inflight": [0, 0], "fallbacks": 1}
    after = {"policy": "affinity", "chosen": [10, 7], "inflight": [0, 0], "fallbacks": 3}
    assert routing_delta(before, after) == {"policy": "affinity", "chosen": [6, 7],
                                            "inflight": [0, 0], "fallbacks": 2}
