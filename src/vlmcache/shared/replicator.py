"""Every replica learns what one learned: the cascade's records through a shared Redis log.

A :class:`Replicator` owns one background thread. Tier wrappers (:mod:`vlmcache.shared.
sync`) hand it what their tier recorded (:meth:`offer`, O(1), never blocks); every
``interval_s`` the thread uploads canonical pixels, publishes the pending records, reads
the other replicas' records and applies them to the local tiers through the tiers' own
``record`` methods (so local indexes, gates and verification apply as for local traffic).
A Redis outage only delays or drops sharing (counted); it never reaches a request.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Any

from vlmcache.shared import shares
from vlmcache.shared.records import RecordLog
from vlmcache.store.redis_store import RedisChunkStore

logger = logging.getLogger(__name__)

MAX_PENDING = 10_000


@dataclass(frozen=True)
class ReplicatorStats:
    offered: int
    dropped: int  # past the pending bound (records made while Redis was down too long)
    published: int
    applied: int
    apply_failed: int
    missing_pixels: int


@dataclass
class LocalTiers:
    """The local tiers remote records are applied to (``None``: that tier is off)."""

    exact: Any = None  # ExactTextTier-like: record(prompt, hashes, tenant, chunk_keys, tokens)
    image: Any = None  # ImageEmbeddingTier-like: record(image, content_hash, tenant)
    text: Any = None  # SemanticTextTier-like: record(TextQuery)


class Replicator:
    """Publishes local records and applies remote ones (see the module docstring)."""

    def __init__(self, log: RecordLog, pixels: RedisChunkStore | None, tiers: LocalTiers,
                 interval_s: float = 0.2) -> None:
        self.log = log
        self.pixels = pixels
        self.tiers = tiers
        self.interval_s = interval_s
        self._lock = threading.Lock()
        self._sync_lock = threading.Lock()
        #: Held while a remote record is applied to a tier (the tier wrappers take it too).
        self.lock = threading.RLock()
        self._pending: deque[tuple[shares.Share, Any]] = deque()
        self._offered = self._dropped = self._published = 0
        self._applied = self._apply_failed = self._missing_pixels = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def offer(self, share: shares.Share, pixels: Any = None) -> bool:
        """Queue a local record (with the image's pixel tensors for an ImageShare)."""
        with self._lock:
            self._offered += 1
            if len(self._pending) >= MAX_PENDING:
                self._dropped += 1
                return False
            self._pending.append((share, pixels))
            return True

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="vlmcache-replicator",
                                            daemon=True)
            self._thread.start()

    def close(self) -> None:
        """Stop the thread after a last sync (pending records get one more chance); once."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self.sync()

    def sync(self) -> int:
        """Publish what is pending and apply what others published; records applied."""
        with self._sync_lock:
            self._publish()
            applied = 0
            while True:
                entries = self.log.read()
                applied += sum(self._apply(e.kind, e.body) for e in entries)
                if len(entries) == 0:
                    return applied

    def pending(self) -> int:
        with self._lock:
            return len(self._pending)

    def stats(self) -> ReplicatorStats:
        with self._lock:
            return ReplicatorStats(self._offered, self._dropped, self._published,
                                   self._applied, self._apply_failed, self._missing_pixels)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.sync()
            except Exception:  # the thread must survive anything a tier raises
                logger.exception("shared records: sync failed")

    def _publish(self) -> None:
        """Send what is pending; what Redis did not take waits for the next sync (the
        queue stays bounded: past :data:`MAX_PENDING` the oldest records are dropped)."""
        with self._lock:
            batch = list(self._pending)
            self._pending.clear()
        by_kind: dict[str, list[tuple[shares.Share, Any]]] = {}
        retry: list[tuple[shares.Share, Any]] = []
        for share, pixels in batch:
            if isinstance(share, shares.ImageShare) and not self._upload(share, pixels):
                retry.append((share, pixels))
                continue
            by_kind.setdefault(shares.kind_of(share), []).append((share, pixels))
        sent = 0
        for kind, items in by_kind.items():
            n = self.log.publish(kind, [shares.encode(share) for share, _ in items])
            sent += n
            if n < len(items):  # a pipeline is all or nothing: none of these went out
                retry.extend(items)
        self._requeue(retry)
        with self._lock:
            self._published += sent

    def _requeue(self, items: list[tuple[shares.Share, Any]]) -> None:
        with self._lock:
            self._pending.extendleft(reversed(items))
            while len(self._pending) > MAX_PENDING:
                self._pending.pop()
                self._dropped += 1

    def _upload(self, share: shares.ImageShare, pixels: Any) -> bool:
        if self.pixels is None or pixels is None:
            return False
        return self.pixels.contains(share.pixel_key) or self.pixels.put(share.pixel_key,
                                                                           pixels)

    def _apply(self, kind: str, body: str) -> int:
        share = shares.decode(kind, body)
        try:
            done = share is not None and self._apply_share(share)
        except Exception:  # a tier rejecting a record must not stop the others
            logger.warning("shared records: applying a %s record failed", kind, exc_info=True)
            done = False
        with self._lock:
            if done:
                self._applied += 1
            else:
                self._apply_failed += 1
        return int(done)

    def _apply_share(self, share: shares.Share) -> bool:
        t = self.tiers
        if isinstance(share, shares.ExactShare) and t.exact is not None:
            with self.lock:
                t.exact.record(share.prompt, share.image_hashes, share.tenant,
                               share.chunk_keys, share.prompt_tokens)
            return True
        if isinstance(share, shares.TextShare) and t.text is not None:
            from vlmcache.tiers.semantic_text import TextQuery, strip_placeholders

            _warm(t.text, [share.question, strip_placeholders(share.prompt)])
            with self.lock:
                t.text.record(TextQuery(share.question, share.prompt, share.context,
                                        share.tenant))
            return True
        if isinstance(share, shares.ImageShare) and t.image is not None:
            return self._apply_image(share)
        return False

    def _apply_image(self, share: shares.ImageShare) -> bool:
        from vlmcache.tiers.image_embedding import tensors_to_image

        tensors = self.pixels.get(share.pixel_key) if self.pixels is not None else None
        if tensors is None:
            with self._lock:
                self._missing_pixels += 1
            return False
        image = tensors_to_image(tensors)
        _warm(self.tiers.image, [image], [share.content_hash])
        with self.lock:
            return bool(self.tiers.image.record(image, share.content_hash, share.tenant))


def _warm(tier: Any, items: list[Any], digests: list[str] | None = None) -> None:
    """Embed outside the lock (the tier's memoized embedder then answers ``record`` at once)."""
    embedder = getattr(tier, "embedder", None)
    try:
        if embedder is not None:
            embedder.embed(items, digests) if digests is not None else embedder.embed(items)
    except Exception:  # only a warm-up: record() embeds (and reports) for real
        logger.debug("shared records: embedding warm-up failed", exc_info=True)


def wait_for(predicate: Any, timeout_s: float, step_s: float = 0.02) -> bool:
    """Poll ``predicate()`` until true or ``timeout_s`` passes (for tests and benchmarks)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(step_s)
    return bool(predicate())
