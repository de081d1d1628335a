"""Per-tenant bytes and quotas on the disk tier (issue 14): what serving stores is charged
to the tenant that asked, and one tenant's churn never evicts another's share."""

import torch

from vlmcache.config import VlmCacheConfig
from vlmcache.store.disk import DiskStore
from vlmcache.store.kvstore import open_encoder_store, open_persistent_kv_store

CHUNK = 1024  # payload bytes of one test chunk


def chunk(seed: int) -> dict[str, torch.Tensor]:
    return {"t": torch.full((CHUNK,), seed % 251, dtype=torch.uint8)}


def key(tenant: str, i: int) -> str:
    return f"{ord(tenant[0]):02x}{i:062x}"


def occupancy(store: DiskStore) -> dict:
    return {o.tenant: (o.entries, o.occupancy_bytes) for o in store.tenant_occupancy()}


def test_a_flooding_tenant_evicts_its_own_chunks_not_anothers_share(tmp_path):
    store = DiskStore(tmp_path, 10 * CHUNK, tenant_quota_bytes=5 * CHUNK)
    for i in range(4):
        assert store.put(key("b", i), chunk(i), tenant="b")
    for i in range(50):  # tenant a: a flood of one-off chunks
        assert store.put(key("a", i), chunk(i), tenant="a")
    assert all(store.contains(key("b", i)) for i in range(4))
    assert occupancy(store)["b"] == (4, 4 * CHUNK)
    assert occupancy(store)["a"] == (6, 6 * CHUNK)  # the free rest, its newest chunks
    assert store.contains(key("a", 49)) and not store.contains(key("a", 0))
    evictions = {o.tenant: o.evictions for o in store.tenant_occupancy()}
    assert evictions["a"] == 44 and evictions.get("b", 0) == 0


def test_without_a_quota_the_flood_evicts_everyone(tmp_path):
    store = DiskStore(tmp_path, 10 * CHUNK)
    for i in range(4):
        store.put(key("b", i), chunk(i), tenant="b")
    for i in range(50):
        store.put(key("a", i), chunk(i), tenant="a")
    assert not any(store.contains(key("b", i)) for i in range(4))


def test_tenants_come_back_from_the_files_after_a_reopen(tmp_path):
    store = DiskStore(tmp_path, 100 * CHUNK, tenant_quota_bytes=50 * CHUNK)
    store.put(key("a", 1), chunk(1), tenant="a")
    store.put(key("b", 1), chunk(2), tenant="b")
    store.put(key("b", 2), chunk(3), tenant="b")
    store.put(key("n", 1), chunk(4))
    store.close()
    again = DiskStore(tmp_path, 100 * CHUNK, tenant_quota_bytes=50 * CHUNK)
    assert occupancy(again) == {"a": (1, CHUNK), "b": (2, 2 * CHUNK), None: (1, CHUNK)}


def test_hostile_tenant_names_are_one_short_ascii_label(tmp_path):
    store = DiskStore(tmp_path, 100 * CHUNK)
    assert store.put(key("x", 1), chunk(1), tenant="\ud800/../\x00")
    assert store.put(key("y", 1), chunk(2), tenant="t" * 65536)
    labels = [o.tenant for o in DiskStore(tmp_path, 100 * CHUNK).tenant_occupancy()]
    assert len(labels) == 2 and all(lbl.isascii() and len(lbl) <= 200 for lbl in labels)
    assert store.get(key("x", 1)) is not None


def test_deployment_stores_get_the_configured_eviction_and_quota(tmp_path):
    config = VlmCacheConfig(store_path=str(tmp_path), tenant_quota=0.25, eviction="reuse",
                            disk_budget=4 << 20)
    kv = open_persistent_kv_store(config)
    assert isinstance(kv, DiskStore) and kv.protect_reused
    assert kv._tenants.quota == 1 << 20
    encoder = open_encoder_store(config)
    assert encoder.disk.protect_reused and encoder.disk._tenants.quota > 0
