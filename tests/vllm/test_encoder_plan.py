import torch

from vlmcache.vllm.encoder_plan import TENSOR_NAME, EncoderPlanner, EncoderTransfer


class Store:
    def __init__(self):
        self.data = {}

    def contains(self, key):
        return key in self.data

    def ensure_in_memory(self, key):
        return key in self.data

    def get(self, key):
        return self.data.get(key)

    def put(self, key, tensors):
        self.data[key] = dict(tensors)
        return True


def test_save_then_plan_and_load_in_another_engine():
    store = Store()
    saver = EncoderTransfer(store, "ns", "cpu")
    output = torch.randn(256, 128)
    saver.save({"img-a": output}, "img-a")
    saver.save({"img-a": output}, "img-a")  # already stored: not rewritten
    assert saver.saved == 1
    planner = EncoderPlanner("ns", store.ensure_in_memory)
    assert planner.has("img-a") and not planner.has("img-b")
    assert not EncoderPlanner("other-ns", store.ensure_in_memory).has("img-a")
    assert not EncoderPlanner("ns", store.ensure_in_memory, enabled=False).has("img-a")
    planner.on_allocated("r1", "img-a", 256)
    planner.on_allocated("r1", "img-b", 256)  # not stored: left to the encoder
    planner.on_computed("r1", [1])
    loads = planner.take_loads()
    assert [item.identifier for item in loads] == ["img-a"] and planner.take_loads() == ()
    cache = {}
    EncoderTransfer(store, "ns", "cpu").load(loads, cache)
    assert torch.equal(cache["img-a"], output)
    assert planner.finish("r1", 2) == {"encoder_items": 2, "encoder_loaded": 1,
                                       "encoder_computed": 1}


def test_shape_mismatch_or_vanished_output_is_not_loaded(caplog):
    store = Store()
    planner = EncoderPlanner("ns", store.ensure_in_memory)
    store.data[planner.key("img")] = {TENSOR_NAME: torch.zeros(10, 4)}
    planner.on_allocated("r", "img", 256)
    loads = planner.take_loads()
    cache = {}
    transfer = EncoderTransfer(store, "ns", "cpu")
    transfer.load(loads, cache)
    assert cache == {} and transfer.faults == 1
    assert "changed shape" in caplog.text


def test_non_tensor_outputs_are_not_stored():
    store = Store()
    EncoderTransfer(store, "ns", "cpu").save({"img": (torch.zeros(1),)}, "img")
    assert store.data == {}
