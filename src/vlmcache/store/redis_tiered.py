"""A local chunk store (memory over disk) with the shared Redis tier behind it.

Reads: memory, then disk, then Redis (a Redis hit is verified, then kept locally). Writes:
locally as before, and to Redis behind the caller (bounded queue; drops are counted). A
``read_gate`` lets a load-vs-recompute cost model veto a Redis read from the tier's
measured cost and the chunk's size before any payload moves: a chunk only Redis holds
counts as present (``contains``, what a caller asks before promising a load) only when the
gate accepts it; ``get`` reads whatever it is asked for.
"""

from __future__ import annotations

import inspect
import logging
import threading
from typing import Callable

import torch

from vlmcache.store.redis_blobs import RedisBlobStore
from vlmcache.store.redis_link import RedisSettings, shared_link
from vlmcache.store.read_meter import ReadCost
from vlmcache.store.base import ChunkStore, EvictionListener, StoreStats, Tensors, tensors_nbytes
from vlmcache.store.redis_store import RedisChunkStore, RedisHealth, RedisWriter

logger = logging.getLogger(__name__)

ReadGate = Callable[[ReadCost, int], bool]
"""``(measured cost of the Redis tier, chunk bytes) -> read it from Redis?``"""

REDIS_KINDS = ("kv", "encoder", "images")


class RedisBackedStore:
    """``front`` (a :class:`TieredStore`, or any local chunk store such as a ``DiskStore``)
    with ``redis`` behind it; same interface as the front (attributes this class does not
    define are the front's).

    Eviction listeners hear the front's evictions: a key gone locally counts as gone even
    if Redis still has it (a listener may drop an index entry too early, never too late).
    """

    def __init__(self, front: ChunkStore, redis: RedisChunkStore,
                 writer: RedisWriter | None = None, read_gate: ReadGate | None = None) -> None:
        self.front = front
        self.redis = redis
        self.writer = writer
        self.read_gate = read_gate
        self.name = front.name
        self._owned_puts = "owned" in inspect.signature(front.put).parameters
        self._lock = threading.Lock()
        self._hits = self._misses = self._redis_hits = self._gated = 0
        self._bytes_read = self._bytes_written = 0

    def __getattr__(self, name: str) -> object:
        # Only reached for attributes not defined here (memory, disk, tier-specific extras).
        if name == "front":
            raise AttributeError(name)
        return getattr(self.front, name)

    def add_eviction_listener(self, listener: EvictionListener) -> None:
        self.front.add_eviction_listener(listener)

    def contains(self, key: str) -> bool:
        """Whether a local tier holds ``key``, or Redis does and the gate would read it."""
        return self.front.contains(key) or self._worth_reading(key)

    def get(self, key: str) -> dict[str, torch.Tensor] | None:
        tensors = self.front.get(key)
        if tensors is None:
            tensors = self._fetch(key)
        with self._lock:
            if tensors is None:
                self._misses += 1
            else:
                self._hits += 1
                self._bytes_read += tensors_nbytes(tensors)
        return tensors

    def get_into(self, key: str, name: str, out: memoryview) -> bool:
        """:meth:`get` of a one-tensor uint8 chunk into ``out`` (the local store reads it
        in place when it can); ``False`` on a miss."""
        local = getattr(self.front, "get_into", None)
        if local is None:
            return copy_tensor_into(self.get(key), name, out)
        found = local(key, name, out) or copy_tensor_into(self._fetch(key), name, out)
        with self._lock:
            self._hits += found
            self._misses += not found
            self._bytes_read += out.nbytes if found else 0
        return found

    def put(self, key: str, tensors: Tensors, *, owned: bool = False,
            tenant: str | None = None) -> bool:
        """Local tiers now (charged to ``tenant``), Redis behind the caller; ``True`` if
        either took it."""
        return self._and_redis(self._front_put(key, tensors, owned, tenant), key, tensors,
                               owned)

    def put_row(self, key: str, name: str, row: memoryview, *,
                tenant: str | None = None) -> bool:
        """:meth:`put` of one uint8 tensor ``name`` (the local store writes it in place
        when it can; Redis gets its own copy)."""
        local = getattr(self.front, "put_row", None)
        tensors = {name: torch.frombuffer(bytearray(row), dtype=torch.uint8)}
        kept = (local(key, name, row, tenant=tenant) if local is not None
                else self._front_put(key, tensors, True, tenant))
        return self._and_redis(kept, key, tensors, True)

    def _and_redis(self, kept: bool, key: str, tensors: Tensors, owned: bool) -> bool:
        """Queue (or write) the chunk to Redis too; ``True`` if either tier took it."""
        queued = self.writer.submit(key, tensors, owned=owned) if self.writer else (
            self.redis.put(key, tensors))
        if kept or queued:
            with self._lock:
                self._bytes_written += tensors_nbytes(tensors)
        return kept or queued

    def delete(self, key: str) -> bool:
        local = self.front.delete(key)
        return self.redis.delete(key) or local

    def keys(self) -> list[str]:
        """Local keys (LRU first), then keys only Redis holds."""
        local = self.front.keys()
        seen = set(local)
        return local + [k for k in self.redis.keys() if k not in seen]

    def read_cost(self) -> ReadCost:
        """The Redis tier's measured read cost."""
        return self.redis.read_cost()

    def redis_health(self) -> RedisHealth:
        return self.redis.health(self.writer)

    def tier_stats(self) -> list[StoreStats]:
        local = getattr(self.front, "tier_stats", None)
        return [*(local() if local else [self.front.stats()]), self.redis.stats()]

    def stats(self) -> StoreStats:
        front = self.front.stats()
        redis = self.redis.stats()
        with self._lock:
            return StoreStats(tier=self.name, hits=self._hits, misses=self._misses,
                              evictions=front.evictions, entries=front.entries,
                              occupancy_bytes=front.occupancy_bytes + redis.occupancy_bytes,
                              capacity_bytes=front.capacity_bytes + redis.capacity_bytes,
                              bytes_read=self._bytes_read, bytes_written=self._bytes_written,
                              errors=front.errors + redis.errors)

    def redis_counts(self) -> tuple[int, int]:
        """(chunks served from Redis, Redis reads the gate declined) by this process."""
        with self._lock:
            return self._redis_hits, self._gated

    def flush(self) -> None:
        getattr(self.front, "flush", self.front.close)()
        if self.writer is not None:
            self.writer.flush()

    def close(self) -> None:
        self.front.close()
        if self.writer is not None:
            self.writer.close()

    def _worth_reading(self, key: str) -> bool:
        """Redis holds ``key`` and (with a gate) reading it is predicted to beat recompute."""
        size = self.redis.size_of(key)
        if size is None:
            return False
        if self.read_gate is None or self.read_gate(self.redis.read_cost(), size):
            return True
        with self._lock:
            self._gated += 1
        return False

    def _fetch(self, key: str) -> dict[str, torch.Tensor] | None:
        tensors = self.redis.get(key)
        if tensors is None:
            return None
        self._front_put(key, tensors, True, None)  # freshly decoded: nobody else holds them
        with self._lock:
            self._redis_hits += 1
        return tensors


    def _front_put(self, key: str, tensors: Tensors, owned: bool, tenant: str | None) -> bool:
        if self._owned_puts:
            return bool(self.front.put(key, tensors, owned=owned,  # type: ignore[call-arg]
                                       tenant=tenant))
        return bool(self.front.put(key, tensors, tenant=tenant))  # type: ignore[call-arg]


def recompute_gate(prefill_tokens_per_s: Callable[[], float], tokens_per_chunk: int,
                   prior_bytes_per_s: float) -> ReadGate:
    """A :data:`ReadGate` that reads from Redis only when the predicted read (the tier's
    measured latency and bandwidth; ``prior_bytes_per_s`` until a large read was measured)
    is shorter than recomputing the chunk's ``tokens_per_chunk`` tokens at the engine's
    current prefill rate (e.g. ``lambda: cost_model.prefill_tokens_per_s``)."""
    if tokens_per_chunk < 1 or prior_bytes_per_s <= 0:
        raise ValueError("tokens_per_chunk and prior_bytes_per_s must be positive")

    def gate(cost: ReadCost, nbytes: int) -> bool:
        load_s = cost.predict_s(nbytes)
        if load_s is None:
            load_s = cost.latency_s + nbytes / prior_bytes_per_s
        recompute_s = tokens_per_chunk / max(prefill_tokens_per_s(), 1e-9)
        return load_s < recompute_s

    return gate


def redis_chunk_store(config: object, kind: str) -> RedisChunkStore:
    """The Redis chunk store of ``kind`` (one of :data:`REDIS_KINDS`) for ``config``."""
    if kind not in REDIS_KINDS:
        raise ValueError(f"kind must be one of {list(REDIS_KINDS)}, got {kind!r}")
    budget = {"kv": "redis_kv_budget", "encoder": "redis_encoder_budget",
              "images": "redis_image_budget"}[kind]
    link = shared_link(RedisSettings.from_config(config))
    blobs = RedisBlobStore(link, kind, getattr(config, budget),
                           getattr(config, "redis_chunk_ttl_s"))
    return RedisChunkStore(blobs, name=f"redis-{kind}")


def with_redis(config: object, front: ChunkStore, kind: str,
               read_gate: ReadGate | None = None) -> ChunkStore:
    """``front`` itself when ``config.redis_url`` is unset, else ``front`` with Redis behind."""
    if not getattr(config, "redis_url", None):
        return front
    redis = redis_chunk_store(config, kind)
    writer = RedisWriter(redis, getattr(config, "redis_write_queue_bytes"))
    logger.info("vlmcache: %s chunks shared through %s (budget %d B)", kind,
                redis.blobs.link.settings.safe_url, redis.blobs.budget_bytes)
    return RedisBackedStore(front, redis, writer, read_gate)


def copy_tensor_into(tensors: dict[str, torch.Tensor] | None, name: str,
                     out: memoryview) -> bool:
    """Copy uint8 tensor ``name`` of ``tensors`` into ``out`` if it is exactly that size."""
    tensor = tensors.get(name) if tensors is not None else None
    if tensor is None or tensor.dtype != torch.uint8 or tensor.numel() != out.nbytes:
        return False
    out[:] = tensor.contiguous().numpy().reshape(-1).data
    return True
