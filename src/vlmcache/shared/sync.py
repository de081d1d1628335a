"""Tier wrappers that share what a replica records, and the one call that wires them.

Each wrapper forwards everything to its tier; after a successful ``record`` it offers the
record to the :class:`~vlmcache.shared.replicator.Replicator` (O(1), no Redis on the
request path). Records from other replicas are applied to the *inner* tiers, so they are
never published again.
"""

from __future__ import annotations

import atexit
import logging
from typing import Any, Sequence

from vlmcache.shared import shares
from vlmcache.store.redis_link import RedisSettings, shared_link
from vlmcache.shared.records import RecordLog
from vlmcache.shared.replicator import LocalTiers, Replicator

logger = logging.getLogger(__name__)


class _Wrapper:
    """Forwards to ``inner``; public methods run under the replicator's lock, so records
    applied from other replicas never interleave with this replica's lookups."""

    def __init__(self, inner: Any, replicator: Replicator) -> None:
        self.inner = inner
        self.replicator = replicator

    def __getattr__(self, name: str) -> Any:
        if name in ("inner", "replicator"):
            raise AttributeError(name)
        attr = getattr(self.inner, name)
        if name.startswith("_") or not callable(attr):
            return attr
        lock = self.replicator.lock

        def locked(*args: Any, **kwargs: Any) -> Any:
            with lock:
                return attr(*args, **kwargs)

        return locked


class SharedExactTier(_Wrapper):
    """An exact tier whose records every replica learns."""

    def record(self, prompt: str, image_hashes: Sequence[str], tenant: str | None,
               chunk_keys: Sequence[str], prompt_tokens: int) -> Any:
        with self.replicator.lock:
            rec = self.inner.record(prompt, image_hashes, tenant, chunk_keys, prompt_tokens)
        self.replicator.offer(shares.ExactShare(prompt, tuple(image_hashes), tenant,
                                                tuple(chunk_keys), int(prompt_tokens)))
        return rec


class SharedImageTier(_Wrapper):
    """An image tier whose canonical images (pixels through Redis) every replica learns."""

    def record(self, image: Any, content_hash: str, tenant: str | None) -> bool:
        from vlmcache.tiers.image_embedding import image_store_key, image_to_tensors

        with self.replicator.lock:
            kept = self.inner.record(image, content_hash, tenant)
        if kept:
            key = image_store_key(self.inner.namespace_digest, tenant, content_hash)
            self.replicator.offer(shares.ImageShare(content_hash, tenant, key),
                                  image_to_tensors(image))
        return kept


class SharedTextTier(_Wrapper):
    """Paraphrase tiers whose canonical questions/prompts every replica learns."""

    def record(self, query: Any) -> Any:
        with self.replicator.lock:
            out = self.inner.record(query)
        self.replicator.offer(shares.TextShare(query.question, query.prompt, query.context,
                                               query.tenant))
        return out


def share_cascade(cascade: Any, config: Any, namespace_digest: str) -> Replicator | None:
    """Wrap ``cascade``'s tiers in place so replicas share records through Redis.

    Does nothing (returns ``None``) unless ``config.redis_url`` is set and
    ``config.redis_share_records`` is on. The replicator thread starts at once and stops
    at interpreter exit (after one last sync).
    """
    if not config.redis_url or not config.redis_share_records:
        return None
    from vlmcache.store.redis_tiered import redis_chunk_store

    link = shared_link(RedisSettings.from_config(config))
    log = RecordLog(link, namespace_digest[:32], config.redis_log_max_entries)
    pixels = redis_chunk_store(config, "images") if cascade.image is not None else None
    tiers = LocalTiers(cascade.exact, cascade.image, cascade.text)
    replicator = Replicator(log, pixels, tiers, config.redis_sync_interval_s)
    if cascade.exact is not None:
        cascade.exact = SharedExactTier(cascade.exact, replicator)
    if cascade.image is not None:
        cascade.image = SharedImageTier(cascade.image, replicator)
    if cascade.text is not None:
        cascade.text = SharedTextTier(cascade.text, replicator)
    replicator.start()
    atexit.register(replicator.close)
    logger.info("vlmcache: sharing cascade records through %s (namespace %s)",
                link.settings.safe_url, namespace_digest[:12])
    return replicator
