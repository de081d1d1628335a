"""A byte-bounded chunk store in CPU memory (LRU, or a per-tenant :class:`TierPolicy`)."""

from __future__ import annotations

import logging
import threading
from typing import Iterable

import torch

from vlmcache.store.base import EvictionListener, StoreStats, Tensors, tensors_nbytes
from vlmcache.store.policy import Tenant, TenantLedger, TenantStats, TierPolicy

logger = logging.getLogger(__name__)


def snapshot_tensors(tensors: Tensors) -> dict[str, torch.Tensor]:
    """Detached, contiguous CPU copies of ``tensors`` that share no memory with the originals.

    Raises ``TypeError`` when a name is not a string or a value is not a tensor.
    """
    out: dict[str, torch.Tensor] = {}
    for name, tensor in tensors.items():
        if not isinstance(name, str) or not isinstance(tensor, torch.Tensor):
            raise TypeError(f"chunk entries must be str -> Tensor, got {name!r}: {type(tensor)!r}")
        out[name] = tensor.detach().to("cpu").clone(memory_format=torch.contiguous_format)
    return out


def owned_tensors(tensors: Tensors) -> dict[str, torch.Tensor]:
    out = dict(tensors)
    for name, tensor in out.items():
        if not isinstance(tensor, torch.Tensor) or tensor.device.type != "cpu":
            raise TypeError(f"owned chunk entry {name!r} must be a CPU tensor")
    return out


def notify_evicted(store: str, listeners: Iterable[EvictionListener], keys: Iterable[str]) -> None:
    """Call every listener for every evicted key; a listener's exception is logged, never raised."""
    listeners = list(listeners)
    for key in keys:
        for listener in listeners:
            try:
                listener(key)
            except Exception:  # a listener must never break the store
                logger.warning("%s: eviction listener failed for key %s", store, key, exc_info=True)


class MemoryStore:
    """Thread-safe store of CPU tensors bounded by payload bytes (:func:`tensors_nbytes`).

    Eviction order, admission and per-tenant quotas follow ``policy`` (default: global LRU,
    everything admitted); ``tenant`` on :meth:`put` and :meth:`get` attributes bytes, hits
    and misses to a tenant (:meth:`tenant_stats`).

    ``put`` keeps private copies, so later in-place writes by the caller do not alias the store.
    ``get`` returns a new dict holding the stored tensors themselves (no copy): treat them as
    read-only. ``on_evict(key)`` is called, outside the store's lock, for every key evicted to
    make room, never for an explicit ``delete``.
    """

    def __init__(
        self,
        capacity_bytes: int,
        name: str = "memory",
        on_evict: EvictionListener | None = None,
        policy: TierPolicy | None = None,
    ) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.name = name
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._entries: dict[str, tuple[dict[str, torch.Tensor], int]] = {}
        self._ledger = TenantLedger(policy or TierPolicy(), capacity_bytes)
        self._listeners: list[EvictionListener] = [on_evict] if on_evict is not None else []
        self._occupancy = 0
        self._hits = self._misses = self._evictions = 0
        self._bytes_read = self._bytes_written = 0

    def add_eviction_listener(self, listener: EvictionListener) -> None:
        """Also call ``listener(key)`` for every key evicted to make room."""
        with self._lock:
            self._listeners.append(listener)

    def contains(self, key: str) -> bool:
        """Whether ``key`` is stored; no stats, no LRU touch."""
        with self._lock:
            return key in self._entries

    def size_of(self, key: str) -> int | None:
        """Payload bytes of ``key``, or ``None`` when absent; no stats, no LRU touch."""
        with self._lock:
            entry = self._entries.get(key)
        return None if entry is None else entry[1]

    def get(self, key: str, *, tenant: Tenant = None) -> dict[str, torch.Tensor] | None:
        """The stored tensors (marked used), or ``None`` on a miss (counted for ``tenant``)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._misses += 1
                self._ledger.miss(tenant)
                return None
            self._ledger.hit(key)
            self._hits += 1
            self._bytes_read += entry[1]
            return dict(entry[0])

    def put(self, key: str, tensors: Tensors, *, owned: bool = False,
            tenant: Tenant = None, admitted: bool = False) -> bool:
        """Store a copy of ``tensors`` for ``tenant``, evicting as the policy says.

        ``False`` when the chunk is larger than the capacity or the tenant's quota, or the
        policy does not admit it yet (second sight). ``owned=True``: the caller hands over CPU
        tensors nobody else writes (e.g. views of a pinned staging buffer); they are kept as
        they are, without a copy. ``admitted=True`` skips the admission filter (the chunk
        proved itself already, e.g. it was just read from a lower tier).
        """
        nbytes = tensors_nbytes(tensors)
        with self._lock:
            if not self._ledger.fits(nbytes):
                logger.debug("%s: chunk %s (%d B) exceeds capacity or quota", self.name, key,
                             nbytes)
                return False
            if not admitted and not self._ledger.admit(key, tenant):
                return False
        copies = owned_tensors(tensors) if owned else snapshot_tensors(tensors)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._occupancy -= old[1]
                self._ledger.remove(key)
            evicted = self._evict_locked(tenant, nbytes)
            self._entries[key] = (copies, nbytes)
            self._ledger.add(key, tenant, nbytes)
            self._occupancy += nbytes
            self._bytes_written += nbytes
            listeners = list(self._listeners)
        notify_evicted(self.name, listeners, evicted)
        return True

    def delete(self, key: str) -> bool:
        """Drop ``key`` (listeners are not called); ``True`` when it was stored."""
        with self._lock:
            entry = self._entries.pop(key, None)
            if entry is None:
                return False
            self._occupancy -= entry[1]
            self._ledger.remove(key)
            return True

    def keys(self) -> list[str]:
        """Stored keys in eviction order: least recently used (never-reused ones) first."""
        with self._lock:
            return self._ledger.order()

    def tenant_stats(self) -> list[TenantStats]:
        """Per-tenant hits, misses, evictions, entries, occupancy and bytes of this tier."""
        with self._lock:
            return self._ledger.tenant_stats()

    def stats(self) -> StoreStats:
        """A consistent snapshot of the counters (``errors`` is always 0 in memory)."""
        with self._lock:
            return StoreStats(
                tier=self.name,
                hits=self._hits,
                misses=self._misses,
                evictions=self._evictions,
                entries=len(self._entries),
                occupancy_bytes=self._occupancy,
                capacity_bytes=self.capacity_bytes,
                bytes_read=self._bytes_read,
                bytes_written=self._bytes_written,
                errors=0,
            )

    def close(self) -> None:
        """Nothing to flush; the store stays usable."""

    def _evict_locked(self, tenant: Tenant, incoming: int) -> list[str]:
        """Evict the policy's victims until ``incoming`` bytes of ``tenant`` fit (lock held)."""
        evicted = self._ledger.victims(tenant, incoming, self._occupancy)
        for key in evicted:
            _, nbytes = self._entries.pop(key)
            self._occupancy -= nbytes
            self._evictions += 1
        return evicted
