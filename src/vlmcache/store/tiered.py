"""A two-tier chunk store: CPU memory in front of an optional disk tier written through
(synchronously, or behind the caller on a background thread)."""

from __future__ import annotations

import logging
import threading

import torch

from vlmcache.store.base import EvictionListener, StoreStats, Tensors, tensors_nbytes
from vlmcache.store.disk import DiskStore, check_key
from vlmcache.store.memory import MemoryStore, notify_evicted
from vlmcache.store.writeback import WriteBehind

logger = logging.getLogger(__name__)


class TieredStore:
    """Memory tier in front of an optional disk tier, writing through to both.

    ``get`` tries memory, then disk (a disk hit is promoted into memory; a memory hit marks the
    chunk used on disk too, so hot chunks do not age out of the disk tier). ``put`` returns
    ``True`` when at least one tier kept the chunk. ``on_evict(key)`` and listeners added with
    :meth:`add_eviction_listener` are called when a tier evicts a key that the other tier no
    longer holds either, i.e. when the key has left the tiered store (at least once; under
    concurrent evictions of the same key from both tiers a listener may be told twice).

    ``stats()`` aggregates: hits/misses/bytes_read/bytes_written/evictions count requests to the
    tiered store itself, entries is the number of distinct keys, occupancy and capacity are the
    sums over tiers, errors the sum of the tiers' errors. :meth:`tier_stats` gives each tier's own.
    """

    def __init__(
        self,
        memory: MemoryStore,
        disk: DiskStore | None = None,
        name: str = "tiered",
        on_evict: EvictionListener | None = None,
        write_behind_bytes: int = 0,
    ) -> None:
        self.name = name
        self.memory = memory
        self.disk = disk
        # Disk writes behind the caller keep a slow disk off the request's path.
        self.writer = (WriteBehind(disk, write_behind_bytes)
                       if disk is not None and write_behind_bytes > 0 else None)
        self._lock = threading.Lock()
        self._listeners: list[EvictionListener] = [on_evict] if on_evict is not None else []
        self._hits = self._misses = self._evictions = 0
        self._bytes_read = self._bytes_written = 0
        memory.add_eviction_listener(self._memory_evicted)
        if disk is not None:
            disk.add_eviction_listener(self._disk_evicted)

    def add_eviction_listener(self, listener: EvictionListener) -> None:
        """Also call ``listener(key)`` when a key leaves both tiers through eviction."""
        with self._lock:
            self._listeners.append(listener)

    def contains(self, key: str) -> bool:
        """Whether either tier holds ``key``; no stats, no LRU touch."""
        self._check(key)
        return self.memory.contains(key) or (self.disk is not None and self.disk.contains(key))

    def ensure_in_memory(self, key: str) -> bool:
        """Whether ``key`` is readable; a disk chunk is read, verified and put in memory.

        Lets a caller promise a chunk only after its checksum was checked (no tiered stats).
        """
        self._check(key)
        if self.memory.contains(key):
            return True
        if self.disk is None:
            return False
        tensors = self.disk.get(key)
        return tensors is not None and self.memory.put(key, tensors)

    def get(self, key: str) -> dict[str, torch.Tensor] | None:
        """The chunk from memory, else from disk (then promoted into memory), else ``None``."""
        self._check(key)
        tensors = self.memory.get(key)
        if tensors is not None:
            if self.disk is not None:
                self.disk.touch(key)
        elif self.disk is not None:
            tensors = self.disk.get(key)
            if tensors is not None:
                self.memory.put(key, tensors)
        with self._lock:
            if tensors is None:
                self._misses += 1
            else:
                self._hits += 1
                self._bytes_read += tensors_nbytes(tensors)
        return tensors

    def put(self, key: str, tensors: Tensors, *, owned: bool = False) -> bool:
        """Write to memory and through to disk; ``True`` if at least one tier kept the chunk.

        ``owned``: see :meth:`MemoryStore.put` (the memory tier keeps the tensors uncopied).
        """
        self._check(key)
        kept = self.memory.put(key, tensors, owned=owned)
        if self.writer is not None:
            kept = self.writer.submit(key, tensors) or kept
        elif self.disk is not None:
            kept = self.disk.put(key, tensors) or kept
        if kept:
            with self._lock:
                self._bytes_written += tensors_nbytes(tensors)
        return kept

    def delete(self, key: str) -> bool:
        """Drop ``key`` from both tiers (listeners are not called); ``True`` if either had it."""
        self._check(key)
        in_memory = self.memory.delete(key)
        on_disk = self.disk.delete(key) if self.disk is not None else False
        return in_memory or on_disk

    def keys(self) -> list[str]:
        """Distinct keys: the disk tier's LRU order, then keys held only in memory (LRU first)."""
        memory_keys = self.memory.keys()
        if self.disk is None:
            return memory_keys
        disk_keys = self.disk.keys()
        on_disk = set(disk_keys)
        return disk_keys + [key for key in memory_keys if key not in on_disk]

    def tier_stats(self) -> list[StoreStats]:
        """Each tier's own counters, memory first."""
        return [tier.stats() for tier in self._tiers()]

    def stats(self) -> StoreStats:
        """Aggregate counters of the tiered store (see the class docstring)."""
        tiers = self.tier_stats()
        entries = len(self.keys())
        with self._lock:
            return StoreStats(
                tier=self.name,
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                entries=entries,
                occupancy_bytes=sum(s.occupancy_bytes for s in tiers),
                capacity_bytes=sum(s.capacity_bytes for s in tiers),
                bytes_read=self._bytes_read,
                bytes_written=self._bytes_written,
                errors=sum(s.errors for s in tiers),
            )

    def flush(self) -> None:
        """Finish pending disk writes and flush every tier; the store stays usable."""
        if self.writer is not None:
            self.writer.flush()
        for tier in self._tiers():
            tier.close()

    def close(self) -> None:
        """Flush, and stop the disk writer thread (later puts write synchronously)."""
        writer, self.writer = self.writer, None
        if writer is not None:
            writer.close()
        for tier in self._tiers():
            tier.close()

    def _tiers(self) -> list[MemoryStore | DiskStore]:
        return [self.memory] if self.disk is None else [self.memory, self.disk]

    def _check(self, key: str) -> None:
        """Reject keys the disk tier cannot store before touching either tier."""
        if self.disk is not None:
            check_key(key)

    def _memory_evicted(self, key: str) -> None:
        if self.disk is None or not self.disk.contains(key):
            self._gone(key)

    def _disk_evicted(self, key: str) -> None:
        if not self.memory.contains(key):
            self._gone(key)

    def _gone(self, key: str) -> None:
        with self._lock:
            self._evictions += 1
            listeners = list(self._listeners)
        notify_evicted(self.name, listeners, [key])
