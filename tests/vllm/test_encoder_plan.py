import pytest
import torch

from vlmcache.keys import image_uuid
from vlmcache.vllm.encoder_plan import (
    TENSOR_NAME, EncoderLoad, EncoderPlanner, EncoderTransfer, encode_instead,
)

A = image_uuid("", "tenant-a", "a" * 64)  # identities vlmcache mints (tenant-scoped)
B = image_uuid("", "tenant-a", "b" * 64)


class Store:
    def __init__(self):
        self.data = {}
        self.tenants = {}

    def contains(self, key):
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
    planner = EncoderPlanner("ns", store.contains)
    assert planner.has(A) and not planner.has(B)
    assert not EncoderPlanner("other-ns", store.contains).has(A)
    assert not EncoderPlanner("ns", store.contains, enabled=False).has(A)
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
    planner = EncoderPlanner("ns", store.contains)
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


def test_identities_not_scoped_by_vlmcache_are_never_stored():
    """vLLM's own image hash and client uuids ignore the tenant: storing an encoder output
    under one would let another tenant load it (issue 12's cross-tenant leak). One vLLM
    derived from a minted uuid (hashing in --media-io-kwargs) is stored when the front
    said so (``scoped``)."""
    store = Store()
    saver = EncoderTransfer(store, "ns", "cpu")
    for ident in ("img-shared-1", "3f" * 32, "vlmc-not-hex", A[:-1]):
        saver.save({ident: torch.ones(4, 2)}, ident)
    assert store.data == {} and saver.saved == 0
    saver.save({"3f" * 32: torch.ones(4, 2)}, "3f" * 32, scoped=True)
    assert saver.saved == 1
    # a lookup finds only what was stored: nothing unscoped ever is
    planner = EncoderPlanner("ns", lambda key: key in store.data)
    assert planner.has("3f" * 32) and not planner.has("img-shared-1")
    planner.on_allocated("r", "img-shared-1", 4)
    assert planner.take_loads() == ()


def _two_sides(tmp_path):
    """The scheduler's and the worker's stores: one directory, two memory copies (vLLM's
    ``mp`` executor runs them in two processes)."""
    from vlmcache.store import DiskStore, MemoryStore, TieredStore

    def side():
        return TieredStore(MemoryStore(1 << 20), DiskStore(tmp_path / "encoder", 1 << 24))

    return side(), side()


def test_a_promised_output_the_worker_cannot_load_is_encoded_in_the_same_step(tmp_path):
    """Issue 33 item 1: the scheduler promised an output its store's index held; the worker's
    copy was evicted and the file removed in between. vLLM then raised "Encoder cache miss"
    and the EngineCore died; now the input goes back to the step's encoder inputs."""
    scheduler_store, worker_store = _two_sides(tmp_path)
    planner = EncoderPlanner("ns", scheduler_store.contains)
    output = torch.randn(16, 8)
    worker_store.put(planner.key(A), {TENSOR_NAME: output})  # the first process saved it
    worker_store.flush()
    planner.on_allocated("r1", A, 16, 1)  # the index holds it: promised, nothing read
    assert scheduler_store.memory.size_of(planner.key(A)) is None
    worker_store.memory.delete(planner.key(A))  # the worker's copy evicted ...
    assert worker_store.disk is not None
    worker_store.disk.path_for(planner.key(A)).unlink()  # ... and the file removed
    step_inputs = {"r0": [0]}  # the step's scheduled_encoder_inputs
    cache = {}
    transfer = EncoderTransfer(worker_store, "ns", "cpu")
    failed = transfer.load(planner.take_loads(), cache)
    assert A not in cache and transfer.faults == 1
    assert encode_instead(failed, step_inputs) == 0
    assert step_inputs == {"r0": [0], "r1": [1]}  # vLLM's encoder runs it this step


def test_a_corrupt_file_and_a_raising_store_are_encodes_too(tmp_path):
    scheduler_store, worker_store = _two_sides(tmp_path)
    planner = EncoderPlanner("ns", scheduler_store.contains)
    worker_store.put(planner.key(A), {TENSOR_NAME: torch.randn(16, 8)})
    worker_store.flush()
    planner.on_allocated("r1", A, 16, 0)
    worker_store.memory.delete(planner.key(A))
    path = worker_store.disk.path_for(planner.key(A))
    path.write_bytes(path.read_bytes()[:-8] + b"garbage!")  # damaged in place
    step_inputs: dict[str, list[int]] = {}
    failed = EncoderTransfer(worker_store, "ns", "cpu").load(planner.take_loads(), {})
    encode_instead(failed, step_inputs)
    assert step_inputs == {"r1": [0]}
    assert not planner.has(A)  # the damaged file was dropped: no further promise

    class Raising(Store):
        def get(self, key):
            raise OSError("EIO")

    raising = Raising()
    planner = EncoderPlanner("ns", raising.contains)
    raising.data[planner.key(A)] = {TENSOR_NAME: torch.randn(16, 8)}
    planner.on_allocated("r2", A, 16, 2)
    failed = EncoderTransfer(raising, "ns", "cpu").load(planner.take_loads(), {})
    encode_instead(failed, step_inputs)
    assert step_inputs == {"r1": [0], "r2": [2]}


def test_the_step_inputs_reach_the_worker_as_the_scheduler_outputs_own_dict():
    """vLLM pickles the SchedulerOutput to the worker: the metadata's dict must stay the very
    object the model runner encodes from, or a failed load is handed back to nobody."""
    import pickle

    ec = pytest.importorskip("vlmcache.vllm.ec_connector")
    from vllm.v1.core.sched.output import SchedulerOutput

    out = SchedulerOutput.make_empty()
    out.scheduled_encoder_inputs["r1"] = [0]
    out.ec_connector_metadata = ec.VlmCacheECMetadata(
        loads=(), encode_inputs=out.scheduled_encoder_inputs)
    worker_side = pickle.loads(pickle.dumps(out, protocol=pickle.HIGHEST_PROTOCOL))
    encode_instead([EncoderLoad(A, "k", 16, "r2", 3)],
                   worker_side.ec_connector_metadata.encode_inputs)
    assert worker_side.scheduled_encoder_inputs == {"r1": [0], "r2": [3]}


def test_an_output_encoded_instead_is_reported_as_encoded_not_loaded():
    ec = pytest.importorskip("vlmcache.vllm.ec_connector")
    planner = EncoderPlanner("ns", lambda key: True)
    planner.on_allocated("r1", A, 16, 0)
    planner.take_loads()
    # two TP ranks reported it; the scheduler hears it once
    meta = ec.VlmCacheECWorkerMeta((("r1", A, 0),)).aggregate(
        ec.VlmCacheECWorkerMeta((("r1", A, 0),)))
    assert meta.encoded_instead == (("r1", A, 0),)
    for request_id, identifier, input_id in meta.encoded_instead:
        planner.on_encoded_instead(request_id, identifier, input_id)
    assert planner.finish("r1", 1) == {"encoder_items": 1, "encoder_loaded": 0,
                                       "encoder_computed": 1}
