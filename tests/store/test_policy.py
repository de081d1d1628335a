"""Tenant fairness in one tier (issue 14, seed 004): quotas, second sight, reuse-favouring
eviction, per-tenant stats."""

from __future__ import annotations

import pytest
import torch

from vlmcache.store import DiskStore, MemoryStore, TieredStore
from vlmcache.store.policy import GhostFilter, TenantLedger, TierPolicy


def chunk(value: float) -> dict[str, torch.Tensor]:
    return {"kv": torch.full((25,), float(value))}  # 100 B


def key(tenant: str, i: int) -> str:
    return f"{ord(tenant[0]):02x}{i:04x}"


def test_quota_makes_a_tenant_evict_its_own_entries() -> None:
    store = MemoryStore(1000, policy=TierPolicy(tenant_quota_bytes=500))
    for i in range(5):
        assert store.put(key("b", i), chunk(i), tenant="b")
    for i in range(50):  # a flood of unique chunks from tenant a
        assert store.put(key("a", i), chunk(i), tenant="a")
    assert all(store.contains(key("b", i)) for i in range(5))
    stats = {s.tenant: s for s in store.tenant_stats()}
    assert stats["a"].occupancy_bytes == 500 and stats["a"].evictions == 45
    assert stats["b"].occupancy_bytes == 500 and stats["b"].evictions == 0
    assert store.stats().occupancy_bytes == 1000


def test_a_tenant_alone_may_use_free_space_beyond_its_quota() -> None:
    store = MemoryStore(1000, policy=TierPolicy(tenant_quota_bytes=300))
    for i in range(10):
        assert store.put(key("b", i), chunk(i), tenant="b")
    assert store.stats().entries == 10 and store.stats().evictions == 0
    assert store.put(key("a", 0), chunk(0), tenant="a")  # b is furthest over: b pays
    assert not store.contains(key("b", 0)) and store.contains(key("a", 0))


def test_chunk_larger_than_the_quota_is_refused() -> None:
    store = MemoryStore(1000, policy=TierPolicy(tenant_quota_bytes=50))
    assert not store.put(key("a", 0), chunk(0), tenant="a")
    assert store.stats().entries == 0


def test_second_sight_admits_only_what_was_offered_before() -> None:
    store = MemoryStore(1000, policy=TierPolicy(admission="second_sight"))
    assert not store.put(key("a", 1), chunk(1), tenant="a")
    assert not store.contains(key("a", 1))
    assert store.put(key("a", 1), chunk(1), tenant="a")
    assert store.contains(key("a", 1))
    assert store.put(key("a", 1), chunk(2), tenant="a")  # a stored key is replaced at once
    assert [s.not_admitted for s in store.tenant_stats()] == [1]


def test_ghost_filter_is_bounded() -> None:
    ghost = GhostFilter(entries=3)
    for k in ("k1", "k2", "k3", "k4"):
        assert not ghost.second_sight(k)
    assert not ghost.second_sight("k1")  # forgotten: the oldest of four
    assert ghost.second_sight("k4")


def test_reused_entries_outlive_a_scan_of_one_off_entries() -> None:
    lru = MemoryStore(500)
    slru = MemoryStore(500, policy=TierPolicy(protect_reused=True))
    for store in (lru, slru):
        for i in range(3):
            store.put(key("b", i), chunk(i), tenant="b")
            store.get(key("b", i), tenant="b")
        for i in range(10):
            store.put(key("a", i), chunk(i), tenant="a")
    assert not any(lru.contains(key("b", i)) for i in range(3))
    assert all(slru.contains(key("b", i)) for i in range(3))
    assert slru.keys()[-3:] == [key("b", i) for i in range(3)]  # protected: evicted last


def test_protected_segment_is_capped_and_demotes_its_oldest() -> None:
    ledger = TenantLedger(TierPolicy(protect_reused=True, protected_fraction=0.5), 400)
    for i in range(4):
        ledger.add(f"k{i}", None, 100)
    for i in range(3):
        ledger.hit(f"k{i}")  # the third promotion pushes k0 back to probation
    assert ledger.order() == ["k3", "k0", "k1", "k2"]
    assert ledger.victims(None, 100, 400) == ["k3"]


def test_per_tenant_stats_count_hits_misses_and_bytes() -> None:
    store = MemoryStore(1000)
    store.put(key("a", 0), chunk(0), tenant="a")
    store.get(key("a", 0), tenant="a")
    store.get(key("a", 9), tenant="a")
    store.get(key("b", 9), tenant="b")
    store.delete(key("a", 0))
    stats = {s.tenant: s for s in store.tenant_stats()}
    a = stats["a"]
    assert (a.hits, a.misses, a.entries, a.occupancy_bytes) == (1, 1, 0, 0)
    assert (a.bytes_written, a.bytes_read, a.hit_rate) == (100, 100, 0.5)
    assert (stats["b"].hits, stats["b"].misses) == (0, 1)


def test_tiered_disk_admission_on_second_sight(tmp_path) -> None:
    disk = DiskStore(tmp_path, 10_000)
    tiered = TieredStore(MemoryStore(10_000), disk, disk_admission="second_sight")
    assert tiered.put(key("a", 0), chunk(0), tenant="a")  # memory keeps it
    assert not disk.contains(key("a", 0))
    assert tiered.put(key("a", 0), chunk(0), tenant="a")
    assert disk.contains(key("a", 0))
    assert tiered.tenant_stats()[0].tenant == "a"


def test_promotion_from_disk_bypasses_memory_admission(tmp_path) -> None:
    disk = DiskStore(tmp_path, 10_000)
    disk.put(key("a", 0), chunk(0))
    memory = MemoryStore(10_000, policy=TierPolicy(admission="second_sight"))
    tiered = TieredStore(memory, disk)
    assert tiered.get(key("a", 0), tenant="a") is not None
    assert memory.contains(key("a", 0))


@pytest.mark.parametrize("bad", [dict(tenant_quota_bytes=-1), dict(admission="maybe"),
                                 dict(ghost_entries=0), dict(protected_fraction=0.0)])
def test_policy_validation_names_the_field(bad) -> None:
    with pytest.raises(ValueError, match=next(iter(bad))):
        TierPolicy(**bad)


def test_counters_of_idle_tenants_are_bounded(monkeypatch) -> None:
    import vlmcache.store.policy as policy_mod

    monkeypatch.setattr(policy_mod, "MAX_TRACKED_TENANTS", 8)
    store = MemoryStore(300)
    store.put(key("k", 0), chunk(0), tenant="keeper")
    for i in range(100):  # a hostile client sending a new tenant name per request
        store.get(key("x", i), tenant=f"t{i}")
    stats = store.tenant_stats()
    assert len(stats) == 8 and stats[0].tenant == "keeper" and stats[0].entries == 1


def test_config_keys_reach_the_kv_and_encoder_stores(tmp_path) -> None:
    from vlmcache.config import VlmCacheConfig
    from vlmcache.store.kvstore import open_encoder_store, open_kv_store

    config = VlmCacheConfig.from_dict({
        "store_path": str(tmp_path), "memory_budget": "1MiB", "disk_write": "sync",
        "tenant_quota": 0.5, "admission_memory": "second_sight",
        "admission_disk": "second_sight", "eviction": "lru"})
    for store in (open_kv_store(config), open_encoder_store(config)):
        policy = store.memory._ledger.policy
        assert policy.admission == "second_sight" and not policy.protect_reused
        assert policy.tenant_quota_bytes == store.memory.capacity_bytes // 2
        k = key("a", 7)
        assert not store.put(k, chunk(1), tenant="a")  # neither tier admits a first sight
        assert store.put(k, chunk(1), tenant="a") and store.disk.contains(k)
        store.close()


def test_write_behind_counters_survive_close(tmp_path) -> None:
    disk = DiskStore(tmp_path, 10_000)
    disk.put = lambda key, tensors, tenant=None: False  # e.g. ENOSPC behind the caller
    tiered = TieredStore(MemoryStore(10_000), disk, write_behind_bytes=10_000)
    tiered.put(key("a", 0), chunk(0))
    tiered.close()
    assert tiered.stats().writes_lost == 1
