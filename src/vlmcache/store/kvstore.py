"""The chunk stores of a deployment (KV blocks, encoder outputs), shared per process.

One :class:`TieredStore` per store directory per process, so the scheduler-side and
worker-side connectors of one engine see the same memory tier.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Callable

from vlmcache.config import VlmCacheConfig
from vlmcache.store.disk import DiskStore
from vlmcache.store.memory import MemoryStore
from vlmcache.store.tiered import TieredStore

logger = logging.getLogger(__name__)

WRITE_BEHIND_MAX_BYTES = 1024**3
ENCODER_WRITE_BEHIND_BYTES = 256 * 1024**2

_registry: dict[Path, TieredStore] = {}
_registry_lock = threading.Lock()


def kv_store_dir(config: VlmCacheConfig) -> Path:
    """Where ``config``'s KV chunks live on disk."""
    return config.store_dir / "kv"


def open_kv_store(config: VlmCacheConfig) -> TieredStore:
    """A new memory-over-disk KV store with ``config``'s directory and budgets."""
    memory = MemoryStore(config.memory_budget, name="memory")
    if config.disk_budget == 0:
        return TieredStore(memory, None, name="kv")
    disk = DiskStore(kv_store_dir(config), config.disk_budget, name="disk")
    behind = min(config.memory_budget, WRITE_BEHIND_MAX_BYTES) if config.disk_write == "async" else 0
    return TieredStore(memory, disk, name="kv", write_behind_bytes=behind)


def open_encoder_store(config: VlmCacheConfig) -> TieredStore:
    """A new memory-over-disk store for encoder outputs with ``config``'s budgets."""
    memory = MemoryStore(config.encoder_memory_budget, name="encoder-memory")
    disk = DiskStore(config.store_dir / "encoder", config.encoder_disk_budget,
                     name="encoder-disk")
    behind = ENCODER_WRITE_BEHIND_BYTES if config.disk_write == "async" else 0
    return TieredStore(memory, disk, name="encoder", write_behind_bytes=behind)


def _shared(root: Path, open_store: Callable[[], TieredStore]) -> TieredStore:
    with _registry_lock:
        store = _registry.get(root)
        if store is None:
            store = open_store()
            _registry[root] = store
        return store


def shared_kv_store(config: VlmCacheConfig) -> TieredStore:
    """The process-wide KV store of ``config.store_dir`` (opened on first use)."""
    return _shared(kv_store_dir(config).resolve(), lambda: open_kv_store(config))


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
