"""The load-vs-recompute cost model (no vLLM)."""

import pytest

from vlmcache.vllm.cost import CostModel, CostPriors

GB = 1e9
# KV bytes per token of the two 7B shapes the GPU benchmark runs (fp16)
MHA_BYTES_PER_TOKEN = 512 * 1024   # LLaVA-1.5-7B: 32 layers x 32 KV heads x 128 x 2 x 2 B
GQA_BYTES_PER_TOKEN = 56 * 1024    # Qwen2-VL-7B: 28 layers x 4 KV heads x 128 x 2 x 2 B


def model(read_bps=2 * GB, fixed=0.0001, prefill=20_000.0, enabled=True) -> CostModel:
    return CostModel(CostPriors(read_bps, fixed, prefill), enabled=enabled)


def test_mha_prompt_from_a_2gbps_disk_is_skipped():
    # 680 tokens of MHA KV (356 MB) at 2 GB/s: ~178 ms vs 34 ms of prefill at 20k tok/s
    decision = model().decide(680, 680 * MHA_BYTES_PER_TOKEN)
    assert decision.choice == "skip"
    assert decision.load_ms > decision.recompute_ms
    assert "recompute" in decision.reason and ">=" in decision.reason


def test_gqa_prompt_from_a_2gbps_disk_is_loaded():
    decision = model().decide(680, 680 * GQA_BYTES_PER_TOKEN)
    assert decision.choice == "load"
    assert decision.load_ms < decision.recompute_ms


def test_slow_measured_reads_turn_loads_into_skips():
    cost = model()
    tokens, nbytes = 16, 16 * GQA_BYTES_PER_TOKEN
    assert cost.decide(tokens, nbytes).choice == "load"
    for _ in range(20):  # the tier keeps reading at ~0.1 GB/s
        cost.observe_read(8 * 1024**2, 8 * 1024**2 / (0.1 * GB))
    assert cost.read_bytes_per_s < 0.2 * GB
    assert cost.reads_observed == 20
    assert cost.decide(tokens, nbytes).choice == "skip"


def test_fast_measured_prefill_turns_loads_into_skips():
    cost = model()
    tokens, nbytes = 680, 680 * GQA_BYTES_PER_TOKEN
    assert cost.decide(tokens, nbytes).choice == "load"
    for _ in range(20):
        cost.observe_prefill(4096, 4096 / 1e6)  # 1M tokens/s
    assert cost.prefill_tokens_per_s > 5e5
    assert cost.decide(tokens, nbytes).choice == "skip"


def test_tiny_observations_are_not_learned():
    cost = model()
    cost.observe_read(1024, 1.0)          # too small to say anything about bandwidth
    cost.observe_prefill(3, 1.0)          # a decode step, not a prefill
    cost.observe_read(10**7, 0.0)         # no duration
    assert cost.read_bytes_per_s == 2 * GB
    assert cost.prefill_tokens_per_s == 20_000.0


def test_disabled_model_always_loads():
    decision = model(enabled=False).decide(680, 680 * MHA_BYTES_PER_TOKEN)
    assert decision.choice == "load"


@pytest.mark.parametrize("priors", [(0, 0.0, 1.0), (1.0, -1.0, 1.0), (1.0, 0.0, 0)])
def test_bad_priors_are_refused(priors):
    with pytest.raises(ValueError):
        CostPriors(*priors)
