"""A chunk store on Redis (the :class:`~vlmcache.store.base.ChunkStore` contract), shared by
every replica, plus a bounded background writer so the engine never waits on Redis.

Chunks are serialized with safetensors and kept by :class:`~vlmcache.store.redis_blobs.
RedisBlobStore` (checksummed, byte-bounded, LRU across replicas). Every fault is a miss
or a dropped write, counted and logged; nothing raises to the caller except a malformed key.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from dataclasses import dataclass

import safetensors.torch
import torch

from vlmcache.store.redis_blobs import RedisBlobStore
from vlmcache.store.redis_link import LinkStats
from vlmcache.store.read_meter import ReadCost
from vlmcache.store.base import EvictionListener, StoreStats, Tensors, tensors_nbytes
from vlmcache.store.memory import notify_evicted, snapshot_tensors

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RedisHealth:
    """What went wrong with one Redis store, from this process's side."""

    link: LinkStats
    corrupt_values: int
    dropped_writes: int
    queue_dropped: int
    queued_bytes: int


class RedisChunkStore:
    """Tensors chunks in Redis under one namespace (``kv``, ``encoder``, ``images``...).

    Args:
        blobs: the namespace's verified byte store (budget, TTL, link).
        name: the tier name in stats.
    """

    def __init__(self, blobs: RedisBlobStore, name: str = "redis") -> None:
        self.name = name
        self.blobs = blobs
        self._lock = threading.Lock()
        self._listeners: list[EvictionListener] = []
        self._undecodable = 0

    def add_eviction_listener(self, listener: EvictionListener) -> None:
        """Call ``listener(key)`` for keys this process's puts evicted from Redis."""
        with self._lock:
            self._listeners.append(listener)

    def contains(self, key: str) -> bool:
        """Whether Redis holds ``key`` (``False`` while Redis is unavailable)."""
        return self.blobs.size_of(key) is not None

    def size_of(self, key: str) -> int | None:
        """Bytes ``key`` occupies in Redis, or ``None`` (absent or Redis unavailable)."""
        return self.blobs.size_of(key)

    def get(self, key: str) -> dict[str, torch.Tensor] | None:
        """The verified chunk, or ``None`` (absent, unavailable, corrupt: logged)."""
        payload = self.blobs.get(key)
        if payload is None:
            return None
        try:
            return dict(safetensors.torch.load(payload))
        except Exception as exc:  # checksummed yet undecodable: written by another version
            with self._lock:
                self._undecodable += 1
            logger.warning("%s: chunk %s does not decode (%s); dropped", self.name, key,
                           str(exc)[:200])
            self.blobs.delete(key)
            return None

    def put(self, key: str, tensors: Tensors) -> bool:
        """Serialize and store; ``False`` when too large, Redis refused it, or is down."""
        try:
            payload = safetensors.torch.save(dict(tensors))
        except Exception as exc:  # e.g. non-contiguous views safetensors refuses
            logger.warning("%s: chunk %s cannot be serialized (%s)", self.name, key, exc)
            return False
        kept, evicted = self.blobs.put(key, payload)
        if evicted:
            with self._lock:
                listeners = list(self._listeners)
            notify_evicted(self.name, listeners, evicted)
        return kept

    def delete(self, key: str) -> bool:
        return self.blobs.delete(key)

    def keys(self) -> list[str]:
        return self.blobs.keys()

    def read_cost(self) -> ReadCost:
        """Measured read latency and bandwidth of this tier (for a load-vs-recompute model)."""
        return self.blobs.read_cost()

    def stats(self) -> StoreStats:
        """Counters of this process; entries/occupancy are Redis's (0 while unreachable)."""
        b = self.blobs.stats()
        with self._lock:
            errors = b.corrupt + b.dropped_writes + self._undecodable
        return StoreStats(tier=self.name, hits=b.hits, misses=b.misses, evictions=b.evictions,
                          entries=max(b.entries, 0), occupancy_bytes=max(b.occupancy_bytes, 0),
                          capacity_bytes=b.capacity_bytes, bytes_read=b.bytes_read,
                          bytes_written=b.bytes_written, errors=errors)

    def health(self, writer: "RedisWriter | None" = None) -> RedisHealth:
        b = self.blobs.stats()
        queued = writer.pending_bytes() if writer is not None else 0
        dropped = writer.dropped() if writer is not None else 0
        return RedisHealth(self.blobs.link.stats(), b.corrupt, b.dropped_writes, dropped,
                           queued)

    def close(self) -> None:
        """Nothing to flush (Redis keeps the data); the store stays usable."""


class RedisWriter:
    """Writes chunks to a :class:`RedisChunkStore` on one background thread.

    The queue is bounded by ``max_bytes``: a chunk that does not fit is dropped (counted,
    logged once per 1,000), so a slow or dead Redis costs memory up to the bound, never time.
    """

    def __init__(self, store: RedisChunkStore, max_bytes: int) -> None:
        self.store = store
        self.max_bytes = max_bytes
        self._cond = threading.Condition()
        self._queue: deque[tuple[str, dict[str, torch.Tensor], int]] = deque()
        self._pending = self._dropped = 0
        self._busy = False
        self._closed = False
        self._thread = threading.Thread(target=self._run, name=f"{store.name}-writer",
                                        daemon=True)
        self._thread.start()

    def submit(self, key: str, tensors: Tensors, *, owned: bool = False) -> bool:
        """Queue a copy of the chunk (no copy when ``owned``); ``False`` if dropped."""
        nbytes = tensors_nbytes(tensors)
        with self._cond:
            if self._closed or self._pending + nbytes > self.max_bytes:
                self._dropped += 1
                dropped = self._dropped
            else:
                dropped = 0
        if dropped:
            if dropped == 1 or dropped % 1000 == 0:
                logger.warning("%s: write queue full (%d B); %d chunk(s) not written to Redis",
                               self.store.name, self.max_bytes, dropped)
            return False
        copy = dict(tensors) if owned else snapshot_tensors(tensors)
        with self._cond:
            self._queue.append((key, copy, nbytes))
            self._pending += nbytes
            self._cond.notify()
        return True

    def pending_bytes(self) -> int:
        with self._cond:
            return self._pending

    def dropped(self) -> int:
        with self._cond:
            return self._dropped

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait until the queue is empty; ``False`` on timeout."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._queue and not self._busy, timeout_s)

    def close(self) -> None:
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=5)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closed)
                if not self._queue:
                    return
                key, tensors, nbytes = self._queue.popleft()
                self._busy = True
            try:
                self.store.put(key, tensors)
            except Exception:  # never let the writer thread die
                logger.exception("%s: writing chunk %s failed", self.store.name, key)
            with self._cond:
                self._pending -= nbytes
                self._busy = False
                self._cond.notify_all()
