"""The Redis chunk store on a real redis-server: round trips, budget, checksums, repair."""

from __future__ import annotations

import time

import pytest
import torch

from vlmcache.store.redis_blobs import MAGIC, RedisBlobStore
from vlmcache.store.redis_link import RedisLink, RedisSettings
from vlmcache.store.base import ChunkStore
from vlmcache.store.redis_store import RedisChunkStore, RedisWriter


def _store(url: str, budget: int = 10_000_000, ns: str = "kv", ttl_s: float = 60.0,
           prefix: str = "vlmtest") -> RedisChunkStore:
    link = RedisLink(RedisSettings(url=url, prefix=prefix, timeout_s=0.5))
    return RedisChunkStore(RedisBlobStore(link, ns, budget, ttl_s))


def _chunk(seed: int, n: int = 1000) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {"k": torch.randn(n, generator=g, dtype=torch.float32),
            "v": torch.randn(n, generator=g).to(torch.bfloat16),
            "ids": torch.arange(7, dtype=torch.int64) + seed}


def _key(i: int) -> str:
    return f"{i:064x}"


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) and a[n].dtype == b[n].dtype
                                        for n in a)


def test_round_trip_and_protocol(live_redis):
    store = _store(live_redis.url)
    assert isinstance(store, ChunkStore)
    chunk = _chunk(1)
    assert store.put(_key(1), chunk)
    assert store.contains(_key(1)) and not store.contains(_key(2))
    assert _same(store.get(_key(1)), chunk)
    assert store.get(_key(2)) is None
    s = store.stats()
    assert (s.hits, s.misses, s.entries) == (1, 1, 1)
    assert s.occupancy_bytes == store.size_of(_key(1)) > 0
    assert store.delete(_key(1)) and not store.delete(_key(1))
    assert store.stats().occupancy_bytes == 0


def test_budget_holds_across_two_stores_evicting_lru(live_redis):
    one = _store(live_redis.url)
    size = len(MAGIC) + 32 + len(__import__("safetensors.torch").torch.save(_chunk(0)))
    budget = 5 * size
    a, b = _store(live_redis.url, budget), _store(live_redis.url, budget)  # two "replicas"
    evicted: list[str] = []
    a.add_eviction_listener(evicted.append)
    for i in range(4):
        (a if i % 2 else b).put(_key(i), _chunk(i))
    assert a.get(_key(0)) is not None  # 0 becomes most recently used
    a.put(_key(4), _chunk(4))
    a.put(_key(5), _chunk(5))
    assert evicted == [_key(1)]
    assert b.keys()[-1] == _key(5) and _key(1) not in b.keys()
    assert one.blobs.stats().occupancy_bytes == 5 * size <= budget
    assert not a.put(_key(9), _chunk(9, n=10_000))  # larger than the whole budget


def test_occupancy_is_the_bytes_redis_holds(live_redis):
    a, b = _store(live_redis.url, budget=200_000), _store(live_redis.url, budget=200_000)
    for i in range(30):  # overwrites with other sizes, deletes, evictions, two writers
        (a if i % 3 else b).put(_key(i % 11), _chunk(i, n=500 + 300 * (i % 4)))
        if i % 7 == 0:
            b.delete(_key((i + 3) % 11))
    client = live_redis.client()
    held = {k: client.strlen(a.blobs.value_key(k)) for k in a.keys()}
    assert all(held.values())  # every accounted key has its value
    assert a.blobs.stats().occupancy_bytes == sum(held.values()) <= 200_000
    assert {k: a.size_of(k) for k in held} == held


def test_corrupt_value_is_a_miss_and_is_dropped(live_redis):
    store = _store(live_redis.url)
    store.put(_key(1), _chunk(1))
    client = live_redis.client()
    vkey = store.blobs.value_key(_key(1))
    raw = bytearray(client.get(vkey))
    raw[-5] ^= 0xFF
    client.set(vkey, bytes(raw))
    assert store.get(_key(1)) is None
    assert client.get(vkey) is None and store.stats().errors == 1
    assert store.blobs.stats().occupancy_bytes == 0


@pytest.mark.parametrize("damage", ["truncate", "swap", "garbage", "foreign-namespace"])
def test_other_damage_is_a_miss(live_redis, damage):
    store = _store(live_redis.url)
    other = _store(live_redis.url, ns="encoder")
    store.put(_key(1), _chunk(1))
    store.put(_key(2), _chunk(2))
    other.put(_key(1), _chunk(3))
    client = live_redis.client()
    vkey = store.blobs.value_key(_key(1))
    if damage == "truncate":
        client.set(vkey, client.get(vkey)[:100])
    elif damage == "swap":  # a valid value of another key under this key
        client.set(vkey, client.get(store.blobs.value_key(_key(2))))
    elif damage == "garbage":
        client.set(vkey, b"x")
    else:  # a valid value of the same key in another namespace
        client.set(vkey, client.get(other.blobs.value_key(_key(1))))
    assert store.get(_key(1)) is None
    assert _same(store.get(_key(2)), _chunk(2))


def test_expired_values_are_repaired_out_of_the_accounting(live_redis):
    store = _store(live_redis.url, ttl_s=0.05)
    store.put(_key(1), _chunk(1))
    assert store.blobs.stats().occupancy_bytes > 0
    time.sleep(0.15)
    assert store.get(_key(1)) is None
    s = store.blobs.stats()
    assert (s.entries, s.occupancy_bytes) == (0, 0)


def test_keys_must_be_hex(live_redis):
    store = _store(live_redis.url)
    for bad in ("../etc/passwd", "AB", "x" * 300, "ab\0cd", ""):
        with pytest.raises(ValueError):
            store.get(bad)


def test_writer_is_bounded_and_flushes(live_redis):
    store = _store(live_redis.url)
    writer = RedisWriter(store, max_bytes=10_000_000)
    for i in range(5):
        assert writer.submit(_key(i), _chunk(i))
    assert writer.flush(10)
    assert store.stats().entries == 5
    small = RedisWriter(store, max_bytes=100)
    assert not small.submit(_key(9), _chunk(9)) and small.dropped() == 1
    writer.close()
    small.close()


def test_read_cost_is_measured(live_redis):
    store = _store(live_redis.url)
    assert store.read_cost().predict_s(1000) is None
    store.put(_key(1), _chunk(1, n=100_000))
    store.size_of(_key(1))
    for _ in range(3):
        store.get(_key(1))
    cost = store.read_cost()
    assert cost.samples == 3 and cost.bytes_per_s > 1e6 and cost.latency_s > 0
    assert cost.predict_s(10**6) > cost.predict_s(10**3) > 0


def test_redis_maxmemory_is_the_backstop(redis_server):
    from vlmcache.testing.redis_server import RedisServer

    small = RedisServer(maxmemory="3mb")  # volatile-lru: only our (expiring) values go
    small.start()
    try:
        store = _store(small.url, budget=10**9)  # our budget far above what Redis allows
        for i in range(200):
            store.put(_key(i), _chunk(i, n=8000))  # ~48 KB each, ~10 MB in all
        served = [i for i in range(200) if (got := store.get(_key(i))) is not None
                  and _same(got, _chunk(i, n=8000))]
        assert 0 < len(served) < 200
        gone = [k for k in store.keys() if store.get(k) is None]  # Redis evicted these
        assert not set(gone) & set(store.keys())  # a read repaired each out of the count
        sizes = [store.size_of(k) for k in store.keys()]
        assert store.blobs.stats().occupancy_bytes == sum(sizes)
        assert small.client().exists("vlmtest:{kv}:lru")  # the index was never evicted
    finally:
        small.stop()
