"""A byte-bounded LRU chunk store in CPU memory."""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from typing import Iterable

import torch

from vlmcache.store.base import EvictionListener, StoreStats, Tensors, tensors_nbytes

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


def _owned_tensors(tensors: Tensors) -> dict[str, torch.Tensor]:
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
    """Thread-safe LRU store of CPU tensors bounded by payload bytes (:func:`tensors_nbytes`).

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
    ) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        self.name = name
        self.capacity_bytes = capacity_bytes
        self._lock = threading.Lock()
        self._entries: OrderedDict[str, tuple[dict[str, torch.Tensor], int]] = OrderedDict()
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

    def get(self, key: str) -> dict[str, torch.Tensor] | None:
        """The stored tensors (marked most recently used), or ``None`` on a miss."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                self._misses += 1
                return None
            self._entries.move_to_end(key)
            self._hits += 1
            self._bytes_read += entry[1]
            return dict(entry[0])

    def put(self, key: str, tensors: Tensors, *, owned: bool = False) -> bool:
        """Store a copy of ``tensors``, evicting LRU chunks; ``False`` if larger than capacity.

        ``owned=True``: the caller hands over CPU tensors nobody else writes (e.g. views of a
        pinned staging buffer); they are kept as they are, without a copy.
        """
        nbytes = tensors_nbytes(tensors)
        if nbytes > self.capacity_bytes:
            logger.debug("%s: chunk %s (%d B) exceeds capacity", self.name, key, nbytes)
            return False
        copies = _owned_tensors(tensors) if owned else snapshot_tensors(tensors)
        with self._lock:
            old = self._entries.pop(key, None)
            if old is not None:
                self._occupancy -= old[1]
            evicted = self._evict_locked(nbytes)
            self._entries[key] = (copies, nbytes)
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
            return True

    def keys(self) -> list[str]:
        """Stored keys, least recently used first."""
        with self._lock:
            return list(self._entries)

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

    def _evict_locked(self, incoming: int) -> list[str]:
        """Evict LRU entries until ``incoming`` more bytes fit; caller holds the lock."""
        evicted: list[str] = []
        while self._entries and self._occupancy + incoming > self.capacity_bytes:
            key, (_, nbytes) = self._entries.popitem(last=False)
            self._occupancy -= nbytes
            self._evictions += 1
            evicted.append(key)
        return evicted
