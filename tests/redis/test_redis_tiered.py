"""Redis behind memory and disk: sharing between two local stores, gate, outage behaviour."""

from __future__ import annotations

import time

import torch

from vlmcache.config import VlmCacheConfig
from vlmcache.store.disk import DiskStore
from vlmcache.store.memory import MemoryStore
from vlmcache.store.redis_tiered import RedisBackedStore, with_redis
from vlmcache.store.tiered import TieredStore


def _key(i: int) -> str:
    return f"{i:064x}"


def _chunk(i: int) -> dict[str, torch.Tensor]:
    return {"kv": torch.full((64, 64), float(i))}


def _replica(tmp_path, url: str, name: str, **kw) -> RedisBackedStore:
    cfg = VlmCacheConfig(store_path=str(tmp_path / name), redis_url=url, redis_prefix="t",
                         redis_timeout_ms=kw.pop("timeout_ms", 200), **kw)
    front = TieredStore(MemoryStore(10_000_000), DiskStore(cfg.store_dir / "kv", 10**8),
                        name="kv")
    store = with_redis(cfg, front, "kv")
    assert isinstance(store, RedisBackedStore)
    return store


def test_without_url_the_front_is_returned(tmp_path):
    front = TieredStore(MemoryStore(1000), None)
    assert with_redis(VlmCacheConfig(store_path=str(tmp_path)), front, "kv") is front


def test_a_chunk_written_by_one_replica_is_read_by_the_other(tmp_path, live_redis):
    a = _replica(tmp_path, live_redis.url, "a")
    b = _replica(tmp_path, live_redis.url, "b")
    assert a.put(_key(1), _chunk(1))
    a.flush()
    assert b.contains(_key(1))
    got = b.get(_key(1))
    assert got is not None and torch.equal(got["kv"], _chunk(1)["kv"])
    assert b.redis_counts() == (1, 0)
    assert b.front.memory.contains(_key(1))  # kept locally: the next read is local
    assert b.contains(_key(1)) and b.redis_counts() == (1, 0)
    names = [s.tier for s in b.tier_stats()]
    assert names[-1] == "redis-kv" and b.stats().hits == 1


def test_the_read_gate_can_decline(tmp_path, live_redis):
    a = _replica(tmp_path, live_redis.url, "a")
    b = _replica(tmp_path, live_redis.url, "b")
    seen = []
    b.read_gate = lambda cost, nbytes: seen.append(nbytes) or False
    a.put(_key(1), _chunk(1))
    a.flush()
    assert not b.contains(_key(1))  # not worth a read
    assert seen and seen[0] > 64 * 64 * 4 and b.redis_counts() == (0, 1)
    b.read_gate = lambda cost, nbytes: True
    assert b.contains(_key(1)) and b.get(_key(1)) is not None
    assert b.redis_counts() == (1, 1)


def test_redis_down_lookups_miss_fast_and_writes_drop(tmp_path, live_redis):
    a = _replica(tmp_path, live_redis.url, "a", timeout_ms=5)
    a.put(_key(1), _chunk(1))
    a.flush()
    live_redis.kill()
    b = _replica(tmp_path, live_redis.url, "b", timeout_ms=5)
    start = time.perf_counter()
    for i in range(50):
        assert b.get(_key(i)) is None
    assert time.perf_counter() - start < 0.5  # ~1 timeout, then fail-fast while down
    assert a.put(_key(2), _chunk(2))  # the local tiers still take it
    assert a.get(_key(2)) is not None
    a.flush()
    health = a.redis_health()
    assert health.dropped_writes >= 1 and not health.link.up


def test_hung_redis_bounds_each_lookup(tmp_path, live_redis):
    b = _replica(tmp_path, live_redis.url, "b", timeout_ms=5)
    assert b.get(_key(1)) is None  # connection opened while healthy
    live_redis.pause()
    try:
        worst = 0.0
        for i in range(20):
            start = time.perf_counter()
            assert b.get(_key(i)) is None
            worst = max(worst, time.perf_counter() - start)
        assert worst < 0.05
    finally:
        live_redis.resume()


def test_a_plain_disk_store_front_works_too(tmp_path, live_redis):
    cfg = VlmCacheConfig(store_path=str(tmp_path), redis_url=live_redis.url, redis_prefix="t",
                         redis_timeout_ms=200)
    a = with_redis(cfg, DiskStore(tmp_path / "a", 10**8), "kv")
    b = with_redis(cfg, DiskStore(tmp_path / "b", 10**8), "kv")
    assert a.put(_key(3), _chunk(3))
    a.flush()
    assert b.get(_key(3)) is not None and b.front.contains(_key(3))  # kept locally
    assert torch.equal(b.get(_key(3))["kv"], _chunk(3)["kv"])
    assert [s.tier for s in b.tier_stats()] == ["disk", "redis-kv"]


def test_a_kv_row_only_in_redis_is_read_into_the_callers_buffer(tmp_path, live_redis):
    import numpy as np

    def disk_replica(name: str) -> RedisBackedStore:
        cfg = VlmCacheConfig(store_path=str(tmp_path / name), redis_url=live_redis.url,
                             redis_prefix="rows")
        store = with_redis(cfg, DiskStore(cfg.store_dir / "kv", 10**8), "kv")
        assert isinstance(store, RedisBackedStore)
        return store

    row = np.random.default_rng(3).integers(0, 256, 4096, dtype=np.uint8)
    a, b = disk_replica("a"), disk_replica("b")
    assert a.put(_key(7), {"kv": torch.from_numpy(row.copy())})
    a.flush()
    out = np.zeros(4096, dtype=np.uint8)
    assert b.get_into(_key(7), "kv", memoryview(out)) and np.array_equal(out, row)
    assert b.redis_counts()[0] == 1 and b.front.contains(_key(7))  # kept on b's disk
    out[:] = 0
    assert b.get_into(_key(7), "kv", memoryview(out)) and np.array_equal(out, row)
    assert b.redis_counts()[0] == 1  # the second read was local, in place
    assert not b.get_into(_key(8), "kv", memoryview(out))
    assert b.stats().hits == 2
