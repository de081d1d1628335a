"""Version shims, against the installed vLLM's own classes."""

from types import SimpleNamespace

import pytest
from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager

from vlmcache.vllm.compat import FinishedRequestGuard, delegate


class _Primary:
    """The CPU primary tier, as far as the manager's request lifecycle reaches."""

    _num_chunks = 4

    def get_kv_memoryview(self):
        return memoryview(bytearray(16))

    def prepare_store(self, keys, req_context):
        return SimpleNamespace(keys_to_store=list(keys), evicted=[])

    def on_request_finished(self, req_context):
        pass


def _finished_request(manager, req_id):
    ctx = ReqContext(req_id=req_id)
    manager.on_new_request(ctx)
    manager.on_request_finished(ctx)  # nothing pending: vLLM drops the request's state
    return ctx


def test_a_store_for_a_finished_request_is_refused_not_a_crash():
    manager = TieringOffloadingManager(_Primary(), [])
    late = _finished_request(manager, "done")
    with pytest.raises(KeyError):  # what vLLM 0.26's scheduler ran into
        manager.prepare_store([b"k"], late)
    guard = FinishedRequestGuard(manager)
    assert guard.prepare_store([b"k"], late) is None and guard.refused == 1
    live = ReqContext(req_id="live")
    guard.on_new_request(live)  # everything else goes through
    assert guard.prepare_store([b"k"], live).keys_to_store == [b"k"]
    assert guard.refused == 1


def test_a_wrapper_binds_methods_once_and_reads_data_live():
    class Wrapper:
        def __init__(self, inner):
            self._inner = inner
            self.looked_up = []

        def __getattr__(self, name):
            self.looked_up.append(name)
            return delegate(self, self._inner, name)

    inner = SimpleNamespace(state={"a": 1}, count=lambda: len(inner.state))
    wrapper = Wrapper(inner)
    assert wrapper.count() == 1 and wrapper.count() == 1
    assert wrapper.looked_up == ["count"]  # bound on first use
    inner.state = {"a": 1, "b": 2}  # data is never cached: a later read sees the change
    assert wrapper.state == {"a": 1, "b": 2} and wrapper.count() == 2
    assert wrapper.looked_up == ["count", "state"]


def _engine(block_layout: str) -> SimpleNamespace:
    return SimpleNamespace(
        kv_transfer_config=SimpleNamespace(kv_connector_extra_config={
            "vlmcache": {"kv_block_layout": block_layout}}),
        attention_config=SimpleNamespace(hisparse_config=None))


def test_per_layer_blocks_drop_the_connectors_layout_where_vllm_would_cross_layers(
        monkeypatch):
    from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
        OffloadingConnector,
    )

    from vlmcache.vllm import compat
    from vlmcache.vllm.offload_connector import VlmCacheOffloadingConnector as Ours

    vllms = OffloadingConnector.get_required_kvcache_layout(_engine("cross_layer"))
    assert Ours.get_required_kvcache_layout(_engine("cross_layer")) == vllms
    monkeypatch.setattr(compat, "vllm_version", lambda: (0, 26))
    assert Ours.get_required_kvcache_layout(_engine("per_layer")) is None  # the backend's
    monkeypatch.setattr(compat, "vllm_version", lambda: (0, 32))  # per layer already
    assert Ours.get_required_kvcache_layout(_engine("per_layer")) == vllms
    # the worker side tells vLLM whether to allocate one tensor across layers
    assert Ours.prefer_cross_layer_blocks.fget(SimpleNamespace(_cross_layer=False)) is False


def test_the_block_layout_is_validated_with_its_allowed_values():
    from vlmcache.config import VlmCacheConfig
    from vlmcache.errors import ConfigError

    with pytest.raises(ConfigError, match="per_layer.*cross_layer|cross_layer.*per_layer"):
        VlmCacheConfig(kv_block_layout="sideways")


def _store_slices_026(status, per_chunk, num_tokens, chunk_tokens):
    """vLLM 0.26 ``_build_store_jobs``'s slices for a finished request (``num_tokens``)."""
    group = status.group_states[0]
    num_chunks = num_tokens // chunk_tokens
    start = group.next_stored_chunk_idx
    keys = group.offload_keys[start:num_chunks]
    blocks = group.block_ids[start * per_chunk + per_chunk - 1:num_chunks * per_chunk:per_chunk]
    return keys, blocks


def test_a_preempted_then_aborted_request_no_longer_trips_vllm_026s_store_assertion():
    from types import SimpleNamespace

    from vlmcache.vllm.compat import clamp_finished_stores

    def status(blocks):
        group = SimpleNamespace(offload_keys=[f"k{i}" for i in range(10)], block_ids=blocks,
                                next_stored_chunk_idx=3)
        return SimpleNamespace(group_states=(group,))

    preempted, intact = status([]), status(list(range(1, 21)))
    sched = SimpleNamespace(_req_status={"a": preempted, "b": intact},
                            config=SimpleNamespace(blocks_per_chunk=2))
    keys, blocks = _store_slices_026(preempted, 2, 10 * 64, 64)
    assert len(keys) != len(blocks)  # 0.26: AssertionError, the EngineCore dies
    out = SimpleNamespace(finished_req_ids={"a", "b"})
    assert clamp_finished_stores(sched, out) == 1
    keys, blocks = _store_slices_026(preempted, 2, 10 * 64, 64)
    assert keys == blocks == []  # nothing to store: its KV left the GPU
    assert preempted.group_states[0].offload_keys == ["k0", "k1", "k2"]  # stored ones kept
    assert intact.group_states[0].offload_keys == [f"k{i}" for i in range(10)]
    keys, blocks = _store_slices_026(intact, 2, 10 * 64, 64)
    assert len(keys) == len(blocks) == 7
    # a scheduler without this state (another vLLM) is left alone
    assert clamp_finished_stores(SimpleNamespace(), out) == 0
    assert clamp_finished_stores(None, out) == 0


def test_ec_transfer_costs_the_runner_only_where_vllms_v2_runner_refuses_it(monkeypatch):
    from vllm.config import VllmConfig

    from vlmcache.vllm.compat import ec_transfer_costs_runner

    assert not ec_transfer_costs_runner("cpu")  # no V2 runner question off the GPU
    # vLLM 0.32 (installed here) takes EC transfer in its V2 runner; 0.26 lists it
    def v026(self):
        unsupported = []
        if self.ec_transfer_config is not None:
            unsupported.append("EC transfer")
        return unsupported

    assert not ec_transfer_costs_runner("cuda")
    monkeypatch.setattr(VllmConfig, "_get_v2_model_runner_unsupported_features", v026)
    assert ec_transfer_costs_runner("cuda")
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "0")  # the operator chose V1
    assert not ec_transfer_costs_runner("cuda")
