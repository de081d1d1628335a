"""Fault trials of hostile inputs: tenant names, uuids, prompts and keys chosen to break
paths (traversal, NUL, 64 KiB strings, lone surrogates), and symlinks planted in a store."""

from __future__ import annotations

import os

from vlmcache_lab.faults import (
    FaultResult, _guard, captured, chunk_for, read_back, repeat, same, scratch,
)
from vlmcache.keys import encoder_output_key, image_uuid, tenant_cache_salt, tenant_scope
from vlmcache.store.disk import DiskStore
from vlmcache.store.memory import MemoryStore
from vlmcache.store.policy import TierPolicy
from vlmcache.store.tiered import TieredStore
from vlmcache.tiers.exact import ExactTextTier

HOSTILE = [
    "../../../../etc/passwd", "..", "/", "a/../../b", "\0", "tenant\0admin", "x" * 65536,
    "\n\r\t", "😀" * 1000, "%2e%2e%2f", "CON", "a\\..\\b", " ", "'; DROP TABLE x;--",
]
SURROGATE = "\ud800"  # a lone surrogate: valid in JSON ("\\ud800"), not encodable as UTF-8


def hostile_names(trials: int) -> FaultResult:
    """Hostile tenants/uuids/prompts through keys, stores and the exact log; hostile keys.

    Tenants and uuids only ever reach the file system as sha256 hex digests; a key that is
    not lowercase hex is refused by the stores with ``ValueError`` (their documented
    contract) before any path is built, and counted here as refused, not as an exception.
    """
    res = FaultResult("hostile_names", method="; ".join(
        ["tenant names, image uuids, prompts: " + ", ".join(repr(h[:24]) for h in HOSTILE),
         "keys: the same strings given as chunk keys (refused with ValueError)"]))
    for _ in range(trials):
        for name in HOSTILE:
            res.trials += 1
            _guard(res, lambda: _hostile_trial(res, name))
    return res


def lone_surrogate_tenant(trials: int) -> FaultResult:
    """A tenant name holding a lone surrogate (a JSON body may carry one) through the same
    path as :func:`hostile_names`. Kept apart: it fails in ``vlmcache.keys`` (strict UTF-8)."""
    res = FaultResult("lone_surrogate_tenant", method="tenant '\\ud800' through keys, "
                      "stores and the exact log")
    return repeat(res, trials, lambda _: _hostile_trial(res, SURROGATE))


def _hostile_trial(res: FaultResult, name: str) -> None:
    with scratch() as root, captured() as log:
        before = set(os.listdir(root.parent))
        store = TieredStore(MemoryStore(1 << 22, policy=TierPolicy(tenant_quota_bytes=1 << 21)),
                            DiskStore(root / "kv", 1 << 22))
        scope = tenant_scope("ns", name)
        uuid = image_uuid("salt", name, name)
        salt = tenant_cache_salt("salt", name)
        key = encoder_output_key("ns", uuid)
        store.put(key, chunk_for(key), tenant=name)
        read_back(res, store, [key], log, {key})
        exact = ExactTextTier(root / "exact.jsonl", scope.hex(), 100)
        exact.record(name, [uuid], name, [key], 1)
        again = ExactTextTier(root / "exact.jsonl", scope.hex(), 100)
        record = again.lookup(name, [uuid], name)
        res.acknowledged += 1
        if record is None:
            res.acknowledged_lost += 1
        elif record.chunk_keys != (key,):
            res.wrong_bytes_served += 1
        for bad in (name, salt + name):
            try:
                store.put(bad, chunk_for(key), tenant=name)
                res.wrong_bytes_served += 1  # a non-hex key must never be stored
            except ValueError:
                pass
        if set(os.listdir(root.parent)) - before - {root.name}:
            res.wrong_bytes_served += 1  # something was written outside the store


def planted_symlinks(trials: int) -> FaultResult:
    """Symlinks planted where the store reads or writes: never followed, never a crash."""
    res = FaultResult("planted_symlinks", method="symlinks at a chunk path, a shard "
                      "directory, manifest.json, .occupancy and the exact log, each pointing "
                      "at a file or directory outside the store")
    return repeat(res, trials, lambda _: _symlink_trial(res))


def _symlink_trial(res: FaultResult) -> None:
    with scratch() as base, captured() as log:
        secret, outside = base / "secret", base / "outside"
        secret.write_bytes(b"secret")
        outside.mkdir()
        root = base / "store"
        (root / "chunks" / "ab").mkdir(parents=True)
        for link in (root / "manifest.json", root / ".occupancy", base / "exact.jsonl"):
            link.symlink_to(secret)
        (root / "chunks" / "cd").symlink_to(outside, target_is_directory=True)
        k_ab, k_cd = "ab" + "1" * 62, "cd" + "2" * 62
        (root / "chunks" / "ab" / f"{k_ab}.safetensors").symlink_to(secret)
        store = DiskStore(root, 1 << 22)
        read_back(res, store, [k_ab], log, set())
        store.put(k_ab, chunk_for(k_ab))
        store.put(k_cd, chunk_for(k_cd))  # refused: its shard is a symlink
        store.close()
        exact = ExactTextTier(base / "exact.jsonl", "ns", 10)
        exact.record("p", ["h"], None, ["aa"], 1)
        got = DiskStore(root, 1 << 22).get(k_ab)
        res.acknowledged += 1
        res.acknowledged_lost += got is None
        res.wrong_bytes_served += got is not None and not same(got, chunk_for(k_ab))
        res.wrong_bytes_served += secret.read_bytes() != b"secret" or any(outside.iterdir())

