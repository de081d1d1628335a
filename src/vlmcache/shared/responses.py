"""The response tier's :class:`~vlmcache.tiers.response.RecordStore` on Redis, shared by
every replica, with this process's memory in front.

``get``: local memory first (a hit costs no round trip), then Redis (a verified hit is kept
locally for the time it has left in Redis, so the local copy never outlives the shared
one). ``put``: both. Redis down: the local store alone answers; Redis writes fail fast
(counted). Keys are the response tier's SHA-256 hex digests.
"""

from __future__ import annotations

import logging

from vlmcache.store.redis_blobs import RedisBlobStore
from vlmcache.store.redis_link import RedisSettings, shared_link

logger = logging.getLogger(__name__)


class RedisRecordStore:
    """Response records in Redis (namespace ``responses``), checksummed, byte-bounded, TTL'd."""

    def __init__(self, blobs: RedisBlobStore) -> None:
        self.blobs = blobs

    def get(self, key: str) -> bytes | None:
        return self.blobs.get(key)

    def get_with_ttl(self, key: str) -> tuple[bytes, float] | None:
        return self.blobs.get_with_ttl(key)

    def put(self, key: str, value: bytes, ttl_s: float) -> bool:
        if ttl_s <= 0:
            return False
        return self.blobs.put(key, bytes(value), ttl_s)[0]

    def delete(self, key: str) -> None:
        self.blobs.delete(key)


class LayeredRecordStore:
    """A local record store (e.g. ``LocalRecordStore``) in front of a :class:`RedisRecordStore`.

    ``shared_hits`` counts values this process got from Redis (another replica's, or its
    own after local eviction).
    """

    def __init__(self, local: object, shared: RedisRecordStore) -> None:
        self.local = local
        self.shared = shared
        self.shared_hits = 0

    def get(self, key: str) -> bytes | None:
        value = self.local.get(key)  # type: ignore[attr-defined]
        if value is not None:
            return value
        found = self.shared.get_with_ttl(key)
        if found is None:
            return None
        value, ttl_s = found
        if ttl_s > 0:
            self.local.put(key, value, ttl_s)  # type: ignore[attr-defined]
        self.shared_hits += 1
        return value

    def put(self, key: str, value: bytes, ttl_s: float) -> bool:
        kept = self.local.put(key, value, ttl_s)  # type: ignore[attr-defined]
        return self.shared.put(key, value, ttl_s) or kept

    def delete(self, key: str) -> None:
        self.local.delete(key)  # type: ignore[attr-defined]
        self.shared.delete(key)


def shared_record_store(config: object, local: object) -> object:
    """``local`` itself without ``config.redis_url``, else ``local`` in front of Redis."""
    if not getattr(config, "redis_url", None):
        return local
    link = shared_link(RedisSettings.from_config(config))
    blobs = RedisBlobStore(link, "responses", getattr(config, "redis_response_budget"),
                           getattr(config, "response_ttl_s"))
    logger.info("vlmcache: responses shared through %s", link.settings.safe_url)
    return LayeredRecordStore(local, RedisRecordStore(blobs))
