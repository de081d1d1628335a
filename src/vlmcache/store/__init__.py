"""Chunk stores: byte-bounded key -> tensors storage tiers (memory, disk, tiered)."""

from vlmcache.store.base import ChunkStore, EvictionListener, StoreStats, Tensors, tensors_nbytes
from vlmcache.store.disk import DiskStore, check_key, chunk_checksum
from vlmcache.store.memory import MemoryStore
from vlmcache.store.policy import TenantStats, TierPolicy
from vlmcache.store.tiered import TieredStore

__all__ = [
    "ChunkStore",
    "DiskStore",
    "EvictionListener",
    "MemoryStore",
    "StoreStats",
    "Tensors",
    "TenantStats",
    "TierPolicy",
    "TieredStore",
    "check_key",
    "chunk_checksum",
    "tensors_nbytes",
]
