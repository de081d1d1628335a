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
