"""End to end on real vLLM: persisted reuse across processes, isolation, faults."""

from __future__ import annotations

import pytest

from vlmcache.errors import ConfigError, RequestError
from vlmcache.keys import image_content_hash
from vlmcache.testing.engine_job import BLOCK_SIZE, greedy, make_request

pytestmark = pytest.mark.vllm


def test_first_process_stored_full_blocks(first_process):
    for result in first_process.values():
        report = result["report"]
        assert report["statuses"]["kv_cache"] == "miss"
        assert report["prompt_tokens"] >= 320
        assert report["blocks_saved"] == report["prompt_tokens"] // BLOCK_SIZE


def test_vlmcache_log_lines_show_in_the_engine_process_log(first_process, job_logs):
    # the engine runs in vLLM's EngineCore process, which only configures vLLM's logger
    log = job_logs["cache"]
    assert "vlmcache KV path on vLLM's offloading connector" in log
    assert "vlmcache KV tier:" in log


def test_new_process_loads_persisted_prefix_and_matches_cache_off(cached_llm, baseline):
    out = cached_llm.generate([make_request(0)], greedy())[0]
    report = out.report
    assert report.prompt_tokens >= 320
    assert report.tokens_loaded >= 0.9 * report.prompt_tokens
    assert report.tokens_loaded == (report.prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE
    assert report.statuses["kv_cache"] == "hit" and report.load_failed_blocks == 0
    assert out.token_ids == baseline[0]["token_ids"]
    assert "kv_cache=hit" in report.log_line() and report.log_line().startswith("[")


def test_exact_tier_canonicalizes_case_and_spacing(cached_llm, baseline):
    original = make_request(1)
    # sentence case and spacing fold; "PLEASE" would not (all-caps may be an acronym)
    variant = type(original)(original.prompt.replace("Please describe", "please   describe"),
                             original.images)
    out = cached_llm.generate([variant], greedy())[0]
    assert out.report.statuses["exact_text"] == "hit"
    assert out.report.hit_tier == "text:exact"
    assert out.report.canonical_prompt == original.prompt
    assert out.report.tokens_loaded >= 0.9 * out.report.prompt_tokens
    assert out.token_ids == baseline[1]["token_ids"]


def test_same_text_other_image_does_not_hit(cached_llm, baseline):
    out = cached_llm.generate([make_request(10)], greedy())[0]
    assert out.report.statuses == {"exact_text": "miss", "fusion": "miss", "kv_cache": "miss"}
    assert out.report.tokens_loaded == 0
    assert out.token_ids == baseline[10]["token_ids"]


def test_same_request_other_tenant_does_not_hit(cached_llm, baseline):
    out = cached_llm.generate([make_request(3, tenant="acme")], greedy())[0]
    assert out.report.tokens_loaded == 0 and out.report.tokens_from_prefix_cache == 0
    assert out.report.statuses["exact_text"] == "miss"
    assert out.token_ids == baseline[3]["token_ids"]
    again = cached_llm.generate([make_request(3, tenant="acme")], greedy())[0]
    assert again.report.tokens_loaded + again.report.tokens_from_prefix_cache > 0


def test_corrupt_and_truncated_chunks_are_recomputed(cached_llm, baseline, store_dir):
    from vlmcache.store.disk import DiskStore

    disk = DiskStore(store_dir / "kv", 1 << 40)
    chunk_keys = _first_process_keys(cached_llm, 2)
    flipped, truncated = disk.path_for(chunk_keys[3]), disk.path_for(chunk_keys[6])
    data = bytearray(flipped.read_bytes())
    data[-10] ^= 0xFF
    flipped.write_bytes(bytes(data))
    truncated.write_bytes(truncated.read_bytes()[:100])
    out = cached_llm.generate([make_request(2)], greedy())[0]
    # the lookup verifies chunks before promising them: the prefix stops at the bad block,
    # which is logged, deleted and (once recomputed) stored again
    assert out.report.tokens_loaded == 3 * BLOCK_SIZE
    assert out.report.statuses["kv_cache"] == "hit"
    assert out.token_ids == baseline[2]["token_ids"]
    assert DiskStore(store_dir / "kv", 1 << 40).get(chunk_keys[3]) is not None  # re-saved


def test_truncated_chunk_is_a_miss(cached_llm, baseline, store_dir):
    from vlmcache.store.disk import DiskStore

    chunk_keys = _first_process_keys(cached_llm, 3)
    path = DiskStore(store_dir / "kv", 1 << 40).path_for(chunk_keys[0])
    path.write_bytes(path.read_bytes()[:50])
    out = cached_llm.generate([make_request(3)], greedy())[0]  # first tenant-free ask here
    assert out.report.tokens_loaded == 0 and out.report.statuses["kv_cache"] == "miss"
    assert out.report.tokens_from_prefix_cache == 0
    assert out.token_ids == baseline[3]["token_ids"]
    assert DiskStore(store_dir / "kv", 1 << 40).get(chunk_keys[0]) is not None  # re-saved


def _first_process_keys(cached_llm, seed):
    """The KV keys the first process stored for ``seed`` (recomputed independently)."""
    exact = cached_llm._cascade.exact
    record = exact.lookup(make_request(seed).prompt,
                          [image_content_hash(im) for im in make_request(seed).images], None)
    assert record is not None and len(record.chunk_keys) >= 10
    return record.chunk_keys


def test_bad_requests_get_clear_errors(cached_llm):
    with pytest.raises(RequestError, match="request 0: prompt must be a non-empty string"):
        cached_llm.generate([""], greedy())
    good = make_request(0)
    with pytest.raises(RequestError, match="request 1: image 0 is a ndarray"):
        import numpy as np

        cached_llm.generate([good, type(good)(good.prompt, (np.zeros((4, 4, 3)),))], greedy())
    with pytest.raises(RequestError, match="tenant must be a non-empty string"):
        cached_llm.generate([type(good)(good.prompt, good.images, "")], greedy())
    with pytest.raises(RequestError, match="expected VlmRequest or str"):
        cached_llm.generate([42], greedy())


def test_bad_config_fails_before_engine_start(tiny_model):
    from vlmcache.api import CachedLLM

    with pytest.raises(ConfigError, match="block_size"):
        CachedLLM(str(tiny_model), {"block_size": 33})
    with pytest.raises(ConfigError, match="unknown config key"):
        CachedLLM(str(tiny_model), {"memroy_budget": "1GiB"})
