"""The KV chunk store of a deployment, shared per process.

One :class:`TieredStore` per store directory per process (:func:`shared_kv_store`), so the
scheduler-side and worker-side connectors of one engine see the same memory tier.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path

from vlmcache.config import VlmCacheConfig
from vlmcache.store.disk import DiskStore
from vlmcache.store.memory import MemoryStore
from vlmcache.store.tiered import TieredStore

logger = logging.getLogger(__name__)

WRITE_BEHIND_MAX_BYTES = 1024**3

_registry: dict[Path, TieredStore] = {}
_registry_lock = threading.Lock()


def kv_store_dir(config: VlmCacheConfig) -> Path:
    """Where ``config``'s KV chunks live on disk."""
    return config.store_dir / "kv"


def open_kv_store(config: VlmCacheConfig) -> TieredStore:
    """A new memory-over-disk KV store with ``config``'s directory and budgets."""
    memory = MemoryStore(config.memory_budget, name="memory")
    disk = DiskStore(kv_store_dir(config), config.disk_budget, name="disk")
    behind = min(config.memory_budget, WRITE_BEHIND_MAX_BYTES) if config.disk_write == "async" else 0
    return TieredStore(memory, disk, name="kv", write_behind_bytes=behind)


def shared_kv_store(config: VlmCacheConfig) -> TieredStore:
    """The process-wide KV store of ``config.store_dir`` (opened on first use)."""
    root = kv_store_dir(config).resolve()
    with _registry_lock:
        store = _registry.get(root)
        if store is None:
            store = open_kv_store(config)
            _registry[root] = store
        return store


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
