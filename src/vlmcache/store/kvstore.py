"""The chunk stores of a deployment: KV rows (the persistent KV tier) and encoder outputs.

The persistent KV tier has one store per engine, opened beside the scheduler by
:mod:`vlmcache.vllm.offload_tier` (its memory tier is vLLM's CPU offload region). Encoder
outputs keep one :class:`TieredStore` per store directory per process.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable

from vlmcache.config import VlmCacheConfig
from vlmcache.store.disk import DiskStore
from vlmcache.store.memory import MemoryStore
from vlmcache.store.policy import memory_policy, tenant_quota_bytes
from vlmcache.store.tiered import TieredStore
from vlmcache.store.redis_tiered import RedisBackedStore, with_redis  # issue 14B

logger = logging.getLogger(__name__)

ENCODER_WRITE_BEHIND_BYTES = 256 * 1024**2

_registry: dict[Path, TieredStore] = {}
_registry_lock = threading.Lock()


def kv_store_dir(config: VlmCacheConfig) -> Path:
    """Where ``config``'s KV chunks live on disk."""
    return config.store_dir / "kv"


def open_kv_store(config: VlmCacheConfig) -> TieredStore:
    """A new memory-over-disk KV store with ``config``'s directory and budgets."""
    memory = MemoryStore(config.memory_budget, name="memory",
                         policy=memory_policy(config, config.memory_budget))
    if config.disk_budget == 0:
        return TieredStore(memory, None, name="kv")
    disk = _disk(config, kv_store_dir(config), config.disk_budget, "disk")
    behind = (min(config.memory_budget, config.disk_write_queue)
              if config.disk_write == "async" else 0)
    return TieredStore(memory, disk, name="kv", write_behind_bytes=behind,
                       disk_admission=config.admission_disk,
                       ghost_entries=config.admission_ghost_entries)


def open_persistent_kv_store(config: VlmCacheConfig) -> DiskStore | RedisBackedStore:
    """The persistent KV tier's chunk store (one per engine, beside its scheduler): the
    memory tier is vLLM's CPU offload region, sized by ``memory_budget``."""
    disk = _disk(config, kv_store_dir(config), config.disk_budget, "kv-disk")
    return with_redis(config, disk, "kv")  # issue 14B: Redis behind the disk, if set


def open_encoder_store(config: VlmCacheConfig) -> TieredStore | RedisBackedStore:
    """A new memory-over-disk store for encoder outputs with ``config``'s budgets."""
    memory = MemoryStore(config.encoder_memory_budget, name="encoder-memory",
                         policy=memory_policy(config, config.encoder_memory_budget))
    disk = _disk(config, config.store_dir / "encoder", config.encoder_disk_budget,
                 "encoder-disk")
    behind = (min(ENCODER_WRITE_BEHIND_BYTES, config.disk_write_queue)
              if config.disk_write == "async" else 0)
    store = TieredStore(memory, disk, name="encoder", write_behind_bytes=behind,
                        disk_admission=config.admission_disk,
                        ghost_entries=config.admission_ghost_entries)
    return with_redis(config, store, "encoder")  # issue 14B: Redis behind, if set


def _disk(config: VlmCacheConfig, root: Path, budget: int, name: str) -> DiskStore:
    """A disk tier with ``config``'s eviction (reuse-favouring or LRU) and tenant quota."""
    return DiskStore(root, budget, name=name, protect_reused=config.eviction == "reuse",
                     tenant_quota_bytes=tenant_quota_bytes(config, budget))


def _shared(root: Path, open_store: Callable[[], TieredStore]) -> TieredStore:
    with _registry_lock:
        store = _registry.get(root)
        if store is None:
            store = open_store()
            _registry[root] = store
        return store


def shared_encoder_store(config: VlmCacheConfig) -> TieredStore:
    """The process-wide encoder-output store of ``config.store_dir``."""
    return _shared((config.store_dir / "encoder").resolve(),
                   lambda: open_encoder_store(config))


def close_shared_stores() -> None:
    """Flush and close every shared store of this process."""
    with _registry_lock:
        stores = list(_registry.values())
        _registry.clear()
    for store in stores:
        try:
            store.close()
        except Exception:
            logger.exception("closing a KV store failed")
