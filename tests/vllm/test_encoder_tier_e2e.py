"""Encoder-output tier (L1.5) on real vLLM: a known image skips the vision encoder."""

from __future__ import annotations

import pytest

from vlmcache.testing.engine_job import ALT_QUESTION, greedy, make_request

pytestmark = pytest.mark.vllm

#: conftest.py's stored seed no test asks of the session's second engine before the fault
#: test (an image already in vLLM's own encoder cache is never loaded: no fault could strike)
FAULT_SEED = 5


def _install_counter(worker) -> bool:
    tower = worker.model_runner.model.vision_tower
    if not hasattr(tower, "_vlmcache_calls"):
        tower._vlmcache_calls = 0

        def count(module, inputs, output):
            module._vlmcache_calls += 1

        tower.register_forward_hook(count)
    return True


def _encoder_calls(worker) -> int:
    return worker.model_runner.model.vision_tower._vlmcache_calls


def encoder_calls(cached_llm) -> int:
    cached_llm.llm.collective_rpc(_install_counter)
    return sum(cached_llm.llm.collective_rpc(_encoder_calls))


def test_first_process_encoded_and_stored_each_image(first_process):
    for result in first_process.values():
        assert result["report"]["images_encoded"] == 1
        assert result["report"]["statuses"]["fusion"] == "miss"


def test_known_image_new_question_new_process_skips_encoder(cached_llm, baseline):
    before = encoder_calls(cached_llm)
    out = cached_llm.generate([make_request(4, ALT_QUESTION)], greedy())[0]
    assert encoder_calls(cached_llm) == before  # the vision tower never ran
    assert out.report.statuses["fusion"] == "hit"
    assert out.report.images_loaded == 1 and out.report.images_encoded == 0
    assert out.token_ids == baseline[("alt", 4)]["token_ids"]
    assert "fusion=hit" in out.report.log_line()


def test_other_tenant_runs_the_encoder(cached_llm, baseline):
    before = encoder_calls(cached_llm)
    out = cached_llm.generate([make_request(4, ALT_QUESTION, tenant="other")], greedy())[0]
    assert encoder_calls(cached_llm) == before + 1
    assert out.report.statuses["fusion"] == "miss" and out.report.images_encoded == 1
    assert out.token_ids == baseline[("alt", 4)]["token_ids"]


def test_stored_outputs_and_kv_are_charged_to_the_tenant_that_asked(cached_llm, store_dir):
    from vlmcache.store.chunkfile import file_facts

    cached_llm.generate([make_request(12, tenant="charged")], greedy())

    def tenants(sub: str) -> set:
        return {file_facts(p, p.name.split(".")[0])[2]
                for p in (store_dir / sub / "chunks").rglob("*.safetensors")}

    assert "charged" in tenants("encoder")
    assert "charged" in tenants("kv")


def test_unseen_image_runs_encoder(cached_llm, baseline):
    before = encoder_calls(cached_llm)
    out = cached_llm.generate([make_request(11)], greedy())[0]
    assert encoder_calls(cached_llm) == before + 1
    assert out.report.statuses["fusion"] == "miss"


def _remove_worker_copy_at_next_read(worker) -> bool:
    """In the worker process: the next encoder-output read first evicts the worker's memory
    copy and removes the file (the scheduler, another process, already holds its own)."""
    from vllm.distributed.ec_transfer import get_ec_transfer

    transfer = get_ec_transfer()._transfer
    store = transfer.store

    class Vanishing:
        def __getattr__(self, name):
            return getattr(store, name)

        def get(self, key, **kwargs):
            transfer.store = store  # one fault
            store.memory.delete(key)
            store.disk.path_for(key).unlink(missing_ok=True)
            return store.get(key, **kwargs)

    transfer.store = Vanishing()
    return True


def test_output_removed_between_scheduler_and_worker_is_encoded(cached_llm, baseline):
    """Issue 33 item 1: the scheduler promised a stored output; the worker's copy was gone.
    vLLM raised "Encoder cache miss" and the EngineCore died; now the worker encodes it."""
    before = encoder_calls(cached_llm)
    cached_llm.llm.collective_rpc(_remove_worker_copy_at_next_read)
    out = cached_llm.generate([make_request(FAULT_SEED, ALT_QUESTION)], greedy())[0]
    assert out.token_ids == baseline[("alt", FAULT_SEED)]["token_ids"]  # the same answer
    assert encoder_calls(cached_llm) == before + 1  # encoded instead of loaded
    assert out.report.images_encoded == 1 and out.report.images_loaded == 0
    again = cached_llm.generate([make_request(4, ALT_QUESTION)], greedy())[0]
    assert again.token_ids == baseline[("alt", 4)]["token_ids"]  # the engine still serves
