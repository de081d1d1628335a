"""The chunk store contract shared by every storage tier.

A *chunk* is a named set of CPU tensors (for KV: one tensor per attention layer holding one
block's keys and values) stored under a hex key computed by :mod:`vlmcache.keys`. Stores never
interpret keys; they only keep bytes within a budget and hand back exactly what was put.
A fault while reading (missing, truncated, corrupt, unreadable) is reported as a miss.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Protocol, runtime_checkable

import torch

Tensors = Mapping[str, torch.Tensor]

EvictionListener = Callable[[str], None]
"""Called with a key a store dropped to make room (never for an explicit ``delete``)."""


def tensors_nbytes(tensors: Tensors) -> int:
    """Bytes the tensors' payload occupies (what byte budgets count)."""
    return sum(t.numel() * t.element_size() for t in tensors.values())


@dataclass(frozen=True)
class StoreStats:
    """Counters of one store tier; ``occupancy_bytes <= capacity_bytes`` always holds."""

    tier: str
    hits: int
    misses: int
    evictions: int
    entries: int
    occupancy_bytes: int
    capacity_bytes: int
    bytes_read: int
    bytes_written: int
    errors: int
    # Issue 14: chunks a write-behind never queued for disk (queue full), and chunks it had
    # acknowledged whose disk write then failed. 0 for tiers that write synchronously.
    writes_dropped: int = 0
    writes_lost: int = 0

    @property
    def hit_rate(self) -> float:
        total = self.hits + self.misses
        return self.hits / total if total else 0.0


@runtime_checkable
class ChunkStore(Protocol):
    """A byte-bounded key -> tensors store. Implementations are thread-safe."""

    name: str

    def contains(self, key: str) -> bool:
        """Whether ``key`` is (probably) stored; no side effects, no stats, no LRU touch."""

    def get(self, key: str) -> dict[str, torch.Tensor] | None:
        """The chunk's tensors, or ``None`` on a miss or on any read fault (logged)."""

    def put(self, key: str, tensors: Tensors) -> bool:
        """Store a chunk; ``False`` when it cannot be kept (too large, I/O fault: logged)."""

    def delete(self, key: str) -> bool:
        """Drop a chunk; ``True`` when it was there."""

    def keys(self) -> list[str]:
        """Stored keys, least recently used first."""

    def stats(self) -> StoreStats:
        """A snapshot of the counters."""

    def close(self) -> None:
        """Flush what needs flushing (manifests); the store stays usable."""
