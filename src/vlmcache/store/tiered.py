"""A two-tier chunk store: CPU memory in front of an optional disk tier written through
(synchronously, or behind the caller on a background thread)."""

from __future__ import annotations

import logging
import threading

import torch

from vlmcache.store.base import EvictionListener, StoreStats, Tensors, tensors_nbytes
from vlmcache.store.disk import DiskStore, check_key
from vlmcache.store.memory import MemoryStore, notify_evicted
from vlmcache.store.policy import Admission, GhostFilter, Tenant, TenantStats
from vlmcache.store.writeback import WriteBehind

logger = logging.getLogger(__name__)

#: The write-behind's intent journals, under the disk tier's directory.
JOURNAL = "journal"


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

    ``disk_admission="second_sight"`` writes a chunk to disk only the second time it is put
    (the memory tier has its own policy). ``tenant`` attributes a request to a tenant for the
    memory tier's quotas and :meth:`tenant_stats`.
    """

    def __init__(
        self,
        memory: MemoryStore,
        disk: DiskStore | None = None,
        name: str = "tiered",
        on_evict: EvictionListener | None = None,
        write_behind_bytes: int = 0,
        disk_admission: Admission = "always",
        ghost_entries: int = 65_536,
    ) -> None:
        self.name = name
        self.memory = memory
        self.disk = disk
        # Disk writes behind the caller keep a slow disk off the request's path.
        # Each queued chunk is journaled, so the next start reports what a crash lost.
        self.writer = (WriteBehind(disk, write_behind_bytes, journal_dir=disk.root / JOURNAL)
                       if disk is not None and write_behind_bytes > 0 else None)
        self._lock = threading.Lock()
        self._final_writer: WriteBehind | None = None
        self._disk_ghost = GhostFilter(ghost_entries) if disk_admission == "second_sight" else None
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

    def locate(self, key: str) -> tuple[str, int] | None:
        """Where ``key`` is and about how many bytes: ``("memory", n)`` or ``("disk", n)``;
        ``None`` when neither tier holds it. No stats, no LRU touch."""
        self._check(key)
        nbytes = self.memory.size_of(key)
        if nbytes is not None:
            return "memory", nbytes
        nbytes = self.disk.size_of(key) if self.disk is not None else None
        return None if nbytes is None else ("disk", nbytes)

    def get(self, key: str, *, tenant: Tenant = None) -> dict[str, torch.Tensor] | None:
        """The chunk from memory, else from disk (then promoted into memory), else ``None``."""
        self._check(key)
        tensors = self.memory.get(key, tenant=tenant)
        if tensors is not None:
            if self.disk is not None:
                self.disk.touch(key)
        elif self.disk is not None:
            tensors = self.disk.get(key)
            if tensors is not None:  # owned: a disk read is a fresh copy (no second
                # one); callers share it as they share a memory hit's tensors
                self.memory.put(key, tensors, owned=True, tenant=tenant, admitted=True)
        with self._lock:
            if tensors is None:
                self._misses += 1
            else:
                self._hits += 1
                self._bytes_read += tensors_nbytes(tensors)
        return tensors

    def put(self, key: str, tensors: Tensors, *, owned: bool = False,
            tenant: Tenant = None) -> bool:
        """Write to memory and through to disk; ``True`` if at least one tier kept the chunk.

        ``owned``: see :meth:`MemoryStore.put` (the memory tier keeps the tensors uncopied,
        and a direct disk write writes them uncopied: neither tier changes them).
        """
        self._check(key)
        kept = self.memory.put(key, tensors, owned=owned, tenant=tenant)
        if self.disk is not None and self._disk_admits(key):
            if self.writer is not None and self.writer.try_submit(key, tensors, tenant):
                kept = True
            else:  # no writer, or its queue is full: written here (backpressure, so a
                # crash never loses more than the queue: dropping left acknowledged
                # chunks in memory only, 10x the queue per kill in issue 33's trials)
                kept = self.disk.put(key, tensors, tenant=tenant, owned=owned) or kept
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

    def tenant_stats(self) -> list[TenantStats]:
        """The memory tier's per-tenant counters (hits, misses, evictions, occupancy, bytes)."""
        return self.memory.tenant_stats()

    def tier_stats(self) -> list[StoreStats]:
        """Each tier's own counters, memory first."""
        return [tier.stats() for tier in self._tiers()]

    def stats(self) -> StoreStats:
        """Aggregate counters of the tiered store (see the class docstring)."""
        tiers = self.tier_stats()
        entries = len(self.keys())
        live = self.writer or self._final_writer
        writer = live.stats() if live is not None else None
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
                writes_dropped=writer.dropped if writer is not None else 0,
                writes_lost=writer.lost if writer is not None else 0,
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
            self._final_writer = writer  # its counters stay in stats()
        for tier in self._tiers():
            tier.close()

    def _tiers(self) -> list[MemoryStore | DiskStore]:
        return [self.memory] if self.disk is None else [self.memory, self.disk]

    def _disk_admits(self, key: str) -> bool:
        if self._disk_ghost is None or self.disk is None or self.disk.contains(key):
            return True
        with self._lock:
            return self._disk_ghost.second_sight(key)

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
