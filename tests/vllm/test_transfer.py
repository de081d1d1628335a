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

    def put(self, key, tensors, owned=False):
        self.data[key] = dict(tensors) if owned else {k: v.clone() for k, v in tensors.items()}
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


@pytest.mark.parametrize("layout,dim", [("blocks_first", 0), ("kv_first", 1)])
def test_saved_chunks_are_views_of_one_buffer_and_load_in_runs(layout, dim):
    from vlmcache.vllm.transfer import _runs

    src_tensors = caches(layout)
    store = DictStore()
    KVTransfer(PagedKV(src_tensors, NB), store).save(
        [BlockTransfer("r", ("a", "b", "c", "d"), (1, 2, 5, 9))])
    name = next(iter(src_tensors))
    parts = [store.data[k][name] for k in "abcd"]
    # one buffer per layer, no per-block copies: adjacent parts coalesce into one view
    assert len({p.untyped_storage().data_ptr() for p in parts}) == 1
    assert len(_runs(parts, pinned=False)) == 1
    mixed = [parts[0], parts[2], parts[3], parts[1]]  # out of order: loose, a view, loose
    runs = _runs(mixed, pinned=False)
    assert len(runs) == 3
    assert torch.equal(torch.cat(runs, dim=0), torch.stack(mixed, dim=0))
    assert all(p.is_contiguous() for p in parts)  # block-major host copies
    dst_tensors = caches(layout, seed=3)
    loader = KVTransfer(PagedKV(dst_tensors, NB), store)
    assert loader.load([BlockTransfer("r", ("a", "c", "d", "b"), (0, 3, 4, 11))]) == set()
    for key, src_id, dst_id in (("a", 1, 0), ("c", 5, 3), ("d", 9, 4), ("b", 2, 11)):
        for n in dst_tensors:
            assert torch.equal(dst_tensors[n].select(dim, dst_id),
                               src_tensors[n].select(dim, src_id)), (key, n)


def test_owned_chunks_survive_later_writes_to_the_kv_cache():
    tensors = caches()
    store = DictStore()
    KVTransfer(PagedKV(tensors, NB), store).save([BlockTransfer("r", ("a",), (4,))])
    name = next(iter(tensors))
    expected = tensors[name][4].clone()
    tensors[name][4].zero_()  # vLLM reuses the block for another request
    assert torch.equal(store.data["a"][name], expected)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("layout,dim", [("blocks_first", 0), ("kv_first", 1)])
def test_gpu_async_save_and_pinned_load_roundtrip(layout, dim):
    from vlmcache.store.memory import MemoryStore
    from vlmcache.store.tiered import TieredStore

    src = {n: t.cuda() for n, t in caches(layout).items()}
    dst = {n: t.cuda() for n, t in caches(layout, seed=4).items()}
    store = TieredStore(MemoryStore(1 << 30))
    ids = list(range(NB - 1))  # more than one pinned slab would need; fine either way
    keys = tuple(f"{i:02x}" for i in ids)
    saver = KVTransfer(PagedKV(src, NB, pinned_bytes=1 << 20), store)
    saver.save([BlockTransfer("r", keys, tuple(ids))])
    expected = {n: t.clone() for n, t in src.items()}
    for t in src.values():
        t.zero_()  # vLLM reuses the blocks right after the step
    saver.flush()
    assert saver.blocks_saved == len(ids)
    chunk = store.get(keys[0])
    assert all(v.is_pinned() for v in chunk.values())
    loader = KVTransfer(PagedKV(dst, NB), store)
    order = list(reversed(ids))
    assert loader.load([BlockTransfer("r2", keys, tuple(order))]) == set()
    torch.cuda.synchronize()
    for n in dst:
        for i, j in zip(ids, order):
            assert torch.equal(dst[n].select(dim, j), expected[n].select(dim, i))
