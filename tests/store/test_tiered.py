"""Tests for the memory-over-disk tiered chunk store."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vlmcache.store import ChunkStore, DiskStore, MemoryStore, TieredStore

A, B, C, D = "aa01", "bb02", "cc03", "dd04"


def chunk(value: float, numel: int = 25) -> dict[str, torch.Tensor]:
    """A one-tensor float32 chunk (100 B by default)."""
    return {"kv": torch.full((numel,), value, dtype=torch.float32)}


def make(tmp_path: Path, mem_chunks: int, disk_chunks: int) -> tuple[TieredStore, list[str]]:
    evicted: list[str] = []
    store = TieredStore(MemoryStore(100 * mem_chunks), DiskStore(tmp_path, 100 * disk_chunks))
    store.add_eviction_listener(evicted.append)
    return store, evicted


def test_implements_protocol(tmp_path: Path) -> None:
    assert isinstance(TieredStore(MemoryStore(100), DiskStore(tmp_path, 100)), ChunkStore)
    assert isinstance(TieredStore(MemoryStore(100), None), ChunkStore)


def test_write_through_and_promotion(tmp_path: Path) -> None:
    store, _ = make(tmp_path, mem_chunks=1, disk_chunks=4)
    assert store.put(A, chunk(1)) and store.put(B, chunk(2))
    assert store.disk is not None
    assert store.memory.keys() == [B] and store.disk.keys() == [A, B]
    out = store.get(A)  # memory miss, disk hit, promoted
    assert out is not None and torch.equal(out["kv"], chunk(1)["kv"])
    assert store.memory.keys() == [A]
    assert store.get(A) is not None  # now a memory hit
    assert store.get(C) is None
    mem, disk = store.tier_stats()
    assert (mem.tier, mem.hits, mem.misses) == ("memory", 1, 2)
    assert (disk.tier, disk.hits, disk.misses) == ("disk", 1, 1)
    agg = store.stats()
    assert agg.tier == "tiered"
    assert (agg.hits, agg.misses, agg.evictions, agg.errors) == (2, 1, 0, 0)
    assert agg.bytes_read == 200 and agg.bytes_written == 200
    assert agg.entries == 2
    assert agg.occupancy_bytes == mem.occupancy_bytes + disk.occupancy_bytes == 300
    assert agg.capacity_bytes == 500


def test_on_evict_only_when_gone_from_both_tiers(tmp_path: Path) -> None:
    store, evicted = make(tmp_path, mem_chunks=1, disk_chunks=2)
    store.put(A, chunk(0))
    store.put(B, chunk(1))  # A leaves memory but is still on disk
    assert evicted == []
    store.put(C, chunk(2))  # B leaves memory (on disk); A leaves disk (not in memory)
    assert evicted == [A]
    assert store.contains(B) and not store.contains(A)
    assert store.delete(C) and not store.contains(C)
    assert evicted == [A]  # delete does not notify
    assert store.stats().evictions == 1


def test_on_evict_when_memory_drops_a_key_the_disk_already_lost(tmp_path: Path) -> None:
    evicted: list[str] = []
    store = TieredStore(MemoryStore(200), DiskStore(tmp_path, 100), on_evict=evicted.append)
    store.put(A, chunk(0))
    store.put(B, chunk(1))  # disk evicts A, memory still holds it
    assert evicted == []
    store.put(C, chunk(2))  # memory evicts A (gone from both); disk evicts B (still in memory)
    assert evicted == [A]
    assert store.keys() == [C, B]


def test_memory_only(tmp_path: Path) -> None:
    evicted: list[str] = []
    store = TieredStore(MemoryStore(100), None, on_evict=evicted.append)
    store.put("x", chunk(0))  # no disk: any key the memory store accepts
    store.put("y", chunk(1))
    assert evicted == ["x"] and store.keys() == ["y"]
    assert len(store.tier_stats()) == 1


def test_put_kept_by_one_tier_is_true(tmp_path: Path) -> None:
    store, _ = make(tmp_path, mem_chunks=1, disk_chunks=4)
    assert store.put(A, chunk(0, numel=50))  # too big for memory, fits disk
    assert store.disk is not None
    assert not store.memory.contains(A) and store.disk.contains(A)
    assert store.get(A) is not None  # served from disk, promotion refused quietly
    assert not store.put(B, chunk(0, numel=200))  # too big for both
    assert store.stats().bytes_written == 200


def test_memory_hit_keeps_chunk_warm_on_disk(tmp_path: Path) -> None:
    store, _ = make(tmp_path, mem_chunks=3, disk_chunks=2)
    store.put(A, chunk(0))
    store.put(B, chunk(1))
    assert store.get(A) is not None  # memory hit; disk LRU becomes [B, A]
    store.put(C, chunk(2))
    assert store.disk is not None and store.disk.keys() == [A, C]


def test_keys_union_contains_and_delete(tmp_path: Path) -> None:
    store, _ = make(tmp_path, mem_chunks=2, disk_chunks=2)
    store.put(A, chunk(0))
    assert store.disk is not None
    store.memory.put(B, chunk(1))  # only in memory
    assert store.keys() == [A, B]
    assert store.delete(A) and store.delete(B) and not store.delete(C)
    assert store.keys() == [] and not store.contains(A) and not store.disk.path_for(A).exists()


def test_invalid_key_rejected_before_any_tier(tmp_path: Path) -> None:
    store, _ = make(tmp_path, mem_chunks=2, disk_chunks=2)
    with pytest.raises(ValueError, match="chunk key"):
        store.put("NOT-HEX", chunk(0))
    assert store.memory.keys() == []


def test_close_persists_disk_tier(tmp_path: Path) -> None:
    store, _ = make(tmp_path, mem_chunks=1, disk_chunks=4)
    store.put(A, chunk(3))
    store.close()
    reopened = TieredStore(MemoryStore(100), DiskStore(tmp_path, 400))
    out = reopened.get(A)
    assert out is not None and torch.equal(out["kv"], chunk(3)["kv"])


def test_locate_says_which_tier_holds_a_key_and_its_size(tmp_path: Path):
    """What the encoder tier's load-versus-encode decision reads: no stats, no read."""
    store = TieredStore(MemoryStore(1000), DiskStore(tmp_path, 1000))
    key = "a" * 64
    assert store.locate(key) is None
    store.put(key, {"t": torch.zeros(100, dtype=torch.uint8)})
    store.flush()
    assert store.locate(key) == ("memory", 100)
    store.memory.delete(key)
    where = store.locate(key)
    assert where is not None and where[0] == "disk" and where[1] >= 100
    assert store.stats().hits == 0 and store.stats().misses == 0


def test_owned_put_writes_the_same_chunk_without_a_copy(tmp_path: Path) -> None:
    """Issue 35: ``owned`` tensors are kept and written as they are (no torch copy), and
    the chunk read back is the one a copying put writes."""
    store, _ = make(tmp_path / "owned", 4, 4)
    copied, _ = make(tmp_path / "copied", 4, 4)
    tensors = {"pixels": torch.arange(300, dtype=torch.uint8).reshape(10, 10, 3)}
    assert store.put(A, tensors, owned=True)
    assert copied.put(A, {"pixels": tensors["pixels"].clone()})
    assert store.memory.get(A)["pixels"] is tensors["pixels"]
    assert torch.equal(store.disk.get(A)["pixels"], copied.disk.get(A)["pixels"])
    assert (tmp_path / "owned").exists()


def test_disk_read_promoted_uncopied(tmp_path: Path) -> None:
    """A chunk read from disk enters memory as read (a fresh copy already): later memory
    hits return those very tensors."""
    store = TieredStore(MemoryStore(100 * 4), DiskStore(tmp_path, 100 * 4))
    store.disk.put(B, chunk(2.0))
    got = store.get(B)
    assert got is not None and torch.equal(got["kv"], chunk(2.0)["kv"])
    assert store.memory.get(B)["kv"] is got["kv"]
