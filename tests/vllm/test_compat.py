"""Version shims, against the installed vLLM's own classes."""

from types import SimpleNamespace

import pytest
from vllm.v1.kv_offload.base import ReqContext
from vllm.v1.kv_offload.tiering.manager import TieringOffloadingManager

from vlmcache.vllm.compat import FinishedRequestGuard


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
