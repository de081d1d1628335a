"""Tests for the in-memory LRU chunk store."""

from __future__ import annotations

import logging
import threading

import pytest
import torch

from vlmcache.store import ChunkStore, MemoryStore, tensors_nbytes


def chunk(value: float, numel: int = 25) -> dict[str, torch.Tensor]:
    """A one-tensor float32 chunk of ``numel`` elements equal to ``value`` (100 B by default)."""
    return {"kv": torch.full((numel,), value, dtype=torch.float32)}


def test_implements_protocol() -> None:
    assert isinstance(MemoryStore(100), ChunkStore)


@pytest.mark.parametrize(
    "dtype",
    [torch.bfloat16, torch.float16, torch.float32, torch.int8, torch.int32, torch.int64,
     torch.bool],
)
def test_roundtrip_dtypes(dtype: torch.dtype) -> None:
    store = MemoryStore(10_000)
    src = {"k": (torch.arange(24) % 7).to(dtype).reshape(2, 3, 4), "v": torch.ones(5, dtype=dtype)}
    assert store.put("ab", src)
    out = store.get("ab")
    assert out is not None and out.keys() == src.keys()
    for name, tensor in src.items():
        assert out[name].dtype == dtype and out[name].shape == tensor.shape
        assert torch.equal(out[name], tensor)


def test_put_copies_contiguous_input() -> None:
    store = MemoryStore(10_000)
    src = chunk(1.0)
    assert store.put("ab", src)
    src["kv"].fill_(9.0)  # the caller reuses its buffer
    out = store.get("ab")
    assert out is not None and torch.equal(out["kv"], chunk(1.0)["kv"])


def test_put_copies_non_contiguous_input() -> None:
    store = MemoryStore(10_000)
    base = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    src = {"t": base.t()}  # non-contiguous view
    assert store.put("ab", src)
    base.zero_()
    out = store.get("ab")
    assert out is not None
    assert out["t"].is_contiguous()
    assert torch.equal(out["t"], torch.arange(12, dtype=torch.float32).reshape(3, 4).t())


def test_lru_eviction_under_byte_budget_and_stats() -> None:
    store = MemoryStore(300)
    for i, key in enumerate(["a", "b", "c"]):
        assert store.put(key, chunk(i))
    assert store.get("a") is not None  # a becomes most recently used
    assert store.put("d", chunk(3))  # needs 100 B: evicts b, the LRU
    assert store.keys() == ["c", "a", "d"]
    assert not store.contains("b") and store.get("b") is None
    stats = store.stats()
    assert stats.evictions == 1
    assert stats.entries == 3
    sizes = [tensors_nbytes(store.get(k) or {}) for k in ["c", "a", "d"]]
    assert stats.occupancy_bytes == 300 == sum(sizes)
    stats = store.stats()
    assert (stats.hits, stats.misses) == (4, 1)  # 1 + 3 hits, b missed
    assert stats.bytes_written == 400 and stats.bytes_read == 400
    assert stats.capacity_bytes == 300 and stats.errors == 0


def test_contains_has_no_side_effects() -> None:
    store = MemoryStore(200)
    store.put("a", chunk(0))
    store.put("b", chunk(1))
    assert store.contains("a")
    store.put("c", chunk(2))  # contains did not touch a: a is still the LRU
    assert store.keys() == ["b", "c"]
    assert (store.stats().hits, store.stats().misses) == (0, 0)


def test_oversized_chunk_rejected_without_evicting() -> None:
    store = MemoryStore(150)
    assert store.put("a", chunk(0))
    assert not store.put("big", chunk(1, numel=50))  # 200 B > 150 B
    assert store.keys() == ["a"]
    assert store.stats().evictions == 0 and store.stats().occupancy_bytes == 100


def test_replacing_a_key_updates_occupancy() -> None:
    store = MemoryStore(1000)
    store.put("a", chunk(0, numel=50))
    store.put("a", chunk(1, numel=10))
    assert store.stats().occupancy_bytes == 40 and store.stats().entries == 1
    out = store.get("a")
    assert out is not None and torch.equal(out["kv"], torch.full((10,), 1.0))


def test_on_evict_called_for_evictions_not_delete() -> None:
    evicted: list[str] = []
    store = MemoryStore(200, on_evict=evicted.append)
    store.put("a", chunk(0))
    store.put("b", chunk(1))
    store.put("c", chunk(2, numel=50))  # 200 B: evicts a and b
    assert evicted == ["a", "b"]
    assert store.delete("c") and not store.delete("c")
    assert evicted == ["a", "b"]
    assert store.stats().occupancy_bytes == 0 and store.stats().evictions == 2


def test_failing_listener_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    def boom(key: str) -> None:
        raise RuntimeError("listener bug")

    store = MemoryStore(100, on_evict=boom)
    store.put("a", chunk(0))
    with caplog.at_level(logging.WARNING, logger="vlmcache.store.memory"):
        assert store.put("b", chunk(1))
    assert store.keys() == ["b"]
    assert any("listener" in r.getMessage() and "a" in r.getMessage() for r in caplog.records)


def test_thread_safety_smoke() -> None:
    store = MemoryStore(64 * 10)  # room for 10 chunks of 64 B
    gets = [0]
    bad: list[str] = []
    count_lock = threading.Lock()

    def worker(tid: int) -> None:
        for i in range(200):
            key = f"{(tid * 7 + i) % 25:02x}"
            if i % 3 == 0:
                store.put(key, {"kv": torch.full((16,), int(key, 16), dtype=torch.float32)})
            else:
                out = store.get(key)
                with count_lock:
                    gets[0] += 1
                expected = torch.full((16,), float(int(key, 16)))
                if out is not None and not torch.equal(out["kv"], expected):
                    bad.append(key)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = store.stats()
    assert not bad
    assert stats.hits + stats.misses == gets[0]
    assert stats.entries == len(store.keys()) <= 10
    assert stats.occupancy_bytes == 64 * stats.entries <= stats.capacity_bytes
