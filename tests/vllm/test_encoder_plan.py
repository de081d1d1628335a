import torch

from vlmcache.keys import image_uuid
from vlmcache.vllm.encoder_plan import TENSOR_NAME, EncoderPlanner, EncoderTransfer

A = image_uuid("", "tenant-a", "a" * 64)  # identities vlmcache mints (tenant-scoped)
B = image_uuid("", "tenant-a", "b" * 64)


class Store:
    def __init__(self):
        self.data = {}
        self.tenants = {}

    def contains(self, key):
        return key in self.data

    def ensure_in_memory(self, key):
        return key in self.data

    def get(self, key):
        return self.data.get(key)

    def put(self, key, tensors, tenant=None):
        self.data[key] = dict(tensors)
        self.tenants[key] = tenant
        return True


def test_save_then_plan_and_load_in_another_engine():
    store = Store()
    saver = EncoderTransfer(store, "ns", "cpu")
    output = torch.randn(256, 128)
    saver.save({A: output}, A, "tenant-a")
    saver.save({A: output}, A, "tenant-a")  # already stored: not rewritten
    assert saver.saved == 1
    assert list(store.tenants.values()) == ["tenant-a"]  # charged to the tenant that asked
    planner = EncoderPlanner("ns", store.ensure_in_memory)
    assert planner.has(A) and not planner.has(B)
    assert not EncoderPlanner("other-ns", store.ensure_in_memory).has(A)
    assert not EncoderPlanner("ns", store.ensure_in_memory, enabled=False).has(A)
    planner.on_allocated("r1", A, 256)
    planner.on_allocated("r1", B, 256)  # not stored: left to the encoder
    planner.on_computed("r1", [1])
    loads = planner.take_loads()
    assert [item.identifier for item in loads] == [A] and planner.take_loads() == ()
    cache = {}
    EncoderTransfer(store, "ns", "cpu").load(loads, cache)
    assert torch.equal(cache[A], output)
    assert planner.finish("r1", 2) == {"encoder_items": 2, "encoder_loaded": 1,
                                       "encoder_computed": 1}


def test_shape_mismatch_or_vanished_output_is_not_loaded(caplog):
    store = Store()
    planner = EncoderPlanner("ns", store.ensure_in_memory)
    store.data[planner.key(A)] = {TENSOR_NAME: torch.zeros(10, 4)}
    planner.on_allocated("r", A, 256)
    loads = planner.take_loads()
    cache = {}
    transfer = EncoderTransfer(store, "ns", "cpu")
    transfer.load(loads, cache)
    assert cache == {} and transfer.faults == 1
    assert "changed shape" in caplog.text


def test_non_tensor_outputs_are_not_stored():
    store = Store()
    EncoderTransfer(store, "ns", "cpu").save({A: (torch.zeros(1),)}, A)
    assert store.data == {}


def test_identities_not_minted_by_vlmcache_are_never_stored_or_loaded():
    """vLLM's own image hash and client uuids ignore the tenant: storing an encoder output
    under one would let another tenant load it (issue 12's cross-tenant leak)."""
    store = Store()
    saver = EncoderTransfer(store, "ns", "cpu")
    for ident in ("img-shared-1", "3f" * 32, "vlmc-not-hex", A[:-1]):
        saver.save({ident: torch.ones(4, 2)}, ident)
    assert store.data == {} and saver.saved == 0
    planner = EncoderPlanner("ns", lambda key: True)  # a store that has everything
    assert not planner.has("img-shared-1") and planner.has(A)
    planner.on_allocated("r", "img-shared-1", 4)
    assert planner.take_loads() == ()
