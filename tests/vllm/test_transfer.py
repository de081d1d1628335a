import pytest
import torch

from vlmcache.vllm.plan import BlockTransfer
from vlmcache.vllm.transfer import KVTransfer, PagedKV

NB = 12


def caches(layout="blocks_first", layers=3, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (NB, 2, 4, 32, 8) if layout == "blocks_first" else (2, NB, 32, 4, 8)
    return {f"model.layers.{i}.attn": torch.randn(shape, generator=g).to(dtype)
            for i in range(layers)}


class DictStore:
    def __init__(self):
        self.data = {}

    def get(self, key):
        return self.data.get(key)

    def delete(self, key):
        return self.data.pop(key, None) is not None

    def put(self, key, tensors):
        self.data[key] = {k: v.clone() for k, v in tensors.items()}
        return True


@pytest.mark.parametrize("layout,dim", [("blocks_first", 0), ("kv_first", 1)])
def test_block_dimension_found_and_roundtrip(layout, dim):
    src = PagedKV(caches(layout), NB)
    assert set(src.block_dims.values()) == {dim}
    dst_tensors = caches(layout, seed=1)
    dst = PagedKV(dst_tensors, NB)
    chunks = src.read_blocks([3, 7])
    dst.write_blocks([5, 0], chunks)
    for name, t in dst_tensors.items():
        assert torch.equal(t.select(dim, 5), src.layers[name].select(dim, 3))
        assert torch.equal(t.select(dim, 0), src.layers[name].select(dim, 7))
        assert not torch.equal(t.select(dim, 1), src.layers[name].select(dim, 1))


def test_ambiguous_or_missing_block_dim():
    with pytest.raises(ValueError, match="no dimension"):
        PagedKV({"l": torch.zeros(3, 5)}, NB)
    assert PagedKV({"l": torch.zeros(NB, NB)}, NB, block_dim_hint=1).block_dims["l"] == 1


def test_save_then_load_into_other_engine():
    a = PagedKV(caches(), NB)
    store = DictStore()
    saver = KVTransfer(a, store)
    assert saver.save([BlockTransfer("r", ("k1", "k2"), (2, 4))]) == 2
    b_tensors = caches(seed=9)
    loader = KVTransfer(PagedKV(b_tensors, NB), store)
    assert loader.load([BlockTransfer("r2", ("k1", "k2"), (8, 9))]) == set()
    for name, t in b_tensors.items():
        assert torch.equal(t[8], a.layers[name][2]) and torch.equal(t[9], a.layers[name][4])
    assert loader.blocks_loaded == 2


def test_missing_chunk_fails_it_and_the_rest_of_the_prefix(caplog):
    store = DictStore()
    KVTransfer(PagedKV(caches(), NB), store).save([BlockTransfer("r", ("k1", "k3"), (1, 3))])
    target = caches(seed=5)
    before = {n: t.clone() for n, t in target.items()}
    loader = KVTransfer(PagedKV(target, NB), store)
    failed = loader.load([BlockTransfer("r", ("k1", "k2", "k3"), (6, 7, 8))])
    assert failed == {7, 8}
    name = next(iter(target))
    assert torch.equal(target[name][6], store.data["k1"][name])  # the good prefix loaded
    assert torch.equal(target[name][8], before[name][8])  # never written after a failure
    assert set(store.data) == {"k1"}  # the unread rest of the failed span is dropped
    assert "gone or unreadable" in caplog.text


@pytest.mark.parametrize("mutate,problem", [
    (lambda c: c.pop(next(iter(c))), "layers differ"),
    (lambda c: c.update({k: v.float() for k, v in c.items()}), "torch.float32"),
    (lambda c: c.update({k: v[:, :2] for k, v in c.items()}), "stored"),
])
def test_chunk_that_does_not_fit_is_refused(mutate, problem, caplog):
    store = DictStore()
    KVTransfer(PagedKV(caches(), NB), store).save([BlockTransfer("r", ("k",), (1,))])
    mutate(store.data["k"])
    failed = KVTransfer(PagedKV(caches(), NB), store).load([BlockTransfer("r", ("k",), (2,))])
    assert failed == {2}
    assert problem in caplog.text
