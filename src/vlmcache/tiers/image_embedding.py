"""Image embedding tier (L2, vision layer): near-duplicate image -> its canonical image.

A request's image is matched against the canonical images seen before (same namespace,
same tenant: the tenant's own scope of the index, no scan of other tenants) by an image
embedder and a FAISS index. The index only proposes candidates (cosine at least
``threshold``, at most ``candidates`` of them; when none of those is verified, up to
``candidates`` more from four copies of the image shifted by ``shift`` 64ths of a side,
each at its best cosine: the embedder tolerates a few pixels of motion, a video frame
moves more); each is then verified on aligned thumbnails (:mod:`vlmcache.tiers.verify`:
colour, layout, mirror, objects added or removed) and the first whose distance is at most
``verify_threshold`` wins. A hit replaces the image by the canonical one: its identity
(content hash, hence vLLM's ``multi_modal_uuids``) *and* its stored pixels, so a cache
that evicted it recomputes the canonical image, never stores the new image's KV under the
canonical name. Canonical pixels live in a bounded chunk store; when the store evicts
one, its index entry goes too.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import time
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from vlmcache.embedders.base import Memoized
from vlmcache.index.faiss_index import IndexEntry, SearchHit, VectorIndex
from vlmcache.store.tiered import TieredStore
from vlmcache.tiers.verify import Prepared, prepare, verify

logger = logging.getLogger(__name__)

_MODES = {1: "L", 3: "RGB", 4: "RGBA"}
SAVE_EVERY = 64
SAVE_INTERVAL_S = 2.0
PREPARED_MEMO = 256  # verifier views of canonical images kept (about 60 KB each)
#: Default shift of the extra candidate-search views, in 64ths of the image side
#: (``image_candidate_shift``): the colour-layout embedder keeps ~3 px of motion close, a
#: video frame 6 px on fell under the cosine floor or below lookalikes; the verifier
#: registers up to 8 px.
CANDIDATE_SHIFT = 5


@dataclass(frozen=True)
class ImageMatch:
    """The canonical image a request's image maps to (itself when ``score == 1`` and
    ``canonical_hash`` is its own hash)."""

    canonical_hash: str
    score: float
    image: Any  # PIL.Image.Image: the canonical pixels (None from ImageEmbeddingTier.best)
    distance: float = 0.0  # the verifier's distance to the canonical image (0: itself)


def image_store_key(namespace_digest: str, tenant: str | None, content_hash: str) -> str:
    """Chunk-store key of a canonical image (bound to namespace and tenant)."""
    scope = "" if tenant is None else "t:" + tenant
    return hashlib.sha256(f"canon-image\0{namespace_digest}\0{scope}\0{content_hash}"
                          .encode()).hexdigest()


def image_to_tensors(image: Any) -> dict[str, torch.Tensor]:
    """PIL image -> ``{"pixels": uint8[H, W, C]}`` (modes other than L/RGB/RGBA -> RGB)."""
    if image.mode not in _MODES.values():
        image = image.convert("RGB")
    arr = np.asarray(image, dtype=np.uint8)
    if arr.ndim == 2:
        arr = arr[:, :, None]
    return {"pixels": torch.from_numpy(arr.copy())}


def shifted_copies(image: Any, shifts: Sequence[tuple[int, int]]) -> list[Any]:
    """``image`` at 64x64 (area resampling), moved by each (dx, dy) px, edges repeated:
    what the embedder sees of a frame that moved (the second candidate-search stage)."""
    from PIL import Image

    small = np.asarray(image.convert("RGB").resize((64, 64), Image.BOX))
    r = max((max(abs(dx), abs(dy)) for dx, dy in shifts), default=0)
    padded = np.pad(small, ((r, r), (r, r), (0, 0)), mode="edge")
    return [Image.fromarray(np.ascontiguousarray(padded[r - dy:r - dy + 64,
                                                         r - dx:r - dx + 64]))
            for dx, dy in shifts]


def tensors_to_image(tensors: dict[str, torch.Tensor]) -> Any:
    """Inverse of :func:`image_to_tensors`."""
    from PIL import Image

    arr = tensors["pixels"].numpy()
    mode = _MODES[arr.shape[2]]
    return Image.fromarray(arr[:, :, 0] if mode == "L" else arr, mode)


class ImageEmbeddingTier:
    """Lookup and record canonical images for one namespace.

    Args:
        index_path: stem of the persisted FAISS index.
        namespace_digest: binds entries and stored pixels to model, weights and salt.
        embedder: memoized image embedder (keyed by image content hash).
        store: bounded chunk store for canonical pixels (its evictions drop index entries).
        threshold: cosine similarity a candidate must reach.
        verify_threshold: the verifier distance a candidate may not exceed.
        candidates: candidates verified per lookup, best cosine first.
        shift: the second search stage's shift in 64ths of a side (0: no second stage).
    """

    def __init__(self, index_path: Path, namespace_digest: str, embedder: Memoized,
                 store: TieredStore, threshold: float, hnsw_threshold: int = 20_000,
                 verify_threshold: float = 0.2, candidates: int = 4,
                 shift: int = CANDIDATE_SHIFT) -> None:
        self.namespace_digest = namespace_digest
        self.embedder = embedder
        self.store = store
        self.threshold = threshold
        self.verify_threshold = verify_threshold
        self.candidates = candidates
        self.shift = shift
        self.index = VectorIndex(embedder.dim, index_path, hnsw_threshold)
        self._prepared: OrderedDict[str, Prepared] = OrderedDict()
        self._prepared_lock = threading.Lock()
        self._last_save = time.monotonic()
        store.add_eviction_listener(self._evicted)
        atexit.register(self.flush)

    def lookup(self, image: Any, content_hash: str, tenant: str | None) -> ImageMatch | None:
        """The first verified canonical image of ``tenant`` at or above the threshold."""
        own = image_store_key(self.namespace_digest, tenant, content_hash)
        if self.index.get(own) is not None:
            return ImageMatch(content_hash, 1.0, image)
        for hit, tensors, distance in self._verified(image, content_hash, tenant, True):
            if distance <= self.verify_threshold:
                return ImageMatch(hit.entry.context, hit.score, tensors_to_image(tensors),
                                  distance)
            logger.debug("image tier: candidate %s (cosine %.3f) refused by the verifier "
                         "(distance %.3f > %.3f)", hit.entry.context[:12], hit.score,
                         distance, self.verify_threshold)
        return None

    def best(self, image: Any, content_hash: str, tenant: str | None) -> ImageMatch | None:
        """The best verified canonical image of ``tenant`` whatever its cosine score.

        Picks what :meth:`lookup` would at cosine threshold -1 (``image`` is ``None``):
        an image that is itself canonical is its own candidate (score 1.0); candidates
        whose pixels are gone are passed over. No side effects besides the memos.
        """
        own = image_store_key(self.namespace_digest, tenant, content_hash)
        if self.index.get(own) is not None:
            return ImageMatch(content_hash, 1.0, None)
        for hit, _, distance in self._verified(image, content_hash, tenant, False):
            if distance <= self.verify_threshold:
                return ImageMatch(hit.entry.context, hit.score, None, distance)
        return None

    def verified_candidates(self, image: Any, content_hash: str,
                            tenant: str | None) -> list[tuple[Any, Any, float]]:
        """Every candidate (up to ``candidates`` per search stage) with its verifier
        distance, whatever its cosine: (index hit, canonical pixels, distance). For
        calibration."""
        return list(self._verified(image, content_hash, tenant, False))

    def _verified(self, image: Any, content_hash: str, tenant: str | None,
                  thresholded: bool) -> Iterator[tuple[Any, Any, float]]:
        """(hit, canonical pixels, verifier distance) per candidate: the image's own
        candidates best cosine first, then those its shifted views add."""
        query: Prepared | None = None
        seen: set[str] = set()
        for hits in self._candidate_stages(image, content_hash, tenant, seen):
            for hit in hits:
                if hit.score >= self.threshold:  # what a lookup verifies at this stage
                    seen.add(hit.entry.key)
                elif thresholded:
                    break
                tensors = self.store.get(hit.entry.key)
                if tensors is None:  # pixels gone: the entry must go too (lookup only)
                    if thresholded:
                        self.index.remove([hit.entry.key])
                    continue
                query = query or prepare(image, (1.0,))
                verdict = verify(query, self._prepared_view(hit.entry.key, tensors),
                                 good_enough=self.verify_threshold if thresholded else 0.0,
                                 refuse_above=self.verify_threshold if thresholded else None)
                yield hit, tensors, verdict.distance

    def _candidate_stages(self, image: Any, content_hash: str, tenant: str | None,
                          seen: set[str]) -> Iterator[list[SearchHit]]:
        """The ``candidates`` best entries of the tenant's scope for the image; then, only
        when those were all consumed (no hit), up to ``candidates`` more (not in
        ``seen``) for its shifted views, each at its best cosine over them, best first."""
        vec = self.embedder.embed([image], [content_hash])[0]
        yield self.index.search_scope(vec, str(tenant), k=self.candidates)
        if not self.shift:
            return
        best: dict[str, SearchHit] = {}
        for vec in self.embedder.embed(*self.shifted_views(image, content_hash)):
            for hit in self.index.search_scope(vec, str(tenant), k=self.candidates + len(seen)):
                known = best.get(hit.entry.key)
                if hit.entry.key not in seen and (known is None or hit.score > known.score):
                    best[hit.entry.key] = hit
        yield sorted(best.values(), key=lambda h: -h.score)[:self.candidates]

    def shifted_views(self, image: Any, content_hash: str) -> tuple[list[Any], list[str]]:
        """The image moved ``shift`` px left, right, up and down (what the second search
        stage embeds) and their memo keys; none when ``shift`` is 0."""
        s = self.shift
        shifts = [(s, 0), (-s, 0), (0, s), (0, -s)] if s else []
        return (shifted_copies(image, shifts),
                [f"{content_hash}:shift{dx},{dy}" for dx, dy in shifts])

    def _prepared_view(self, key: str, tensors: dict[str, torch.Tensor]) -> Prepared:
        with self._prepared_lock:
            found = self._prepared.get(key)
            if found is not None:
                self._prepared.move_to_end(key)
                return found
        fresh = prepare(tensors_to_image(tensors))
        with self._prepared_lock:
            self._prepared[key] = fresh
            while len(self._prepared) > PREPARED_MEMO:
                self._prepared.popitem(last=False)
        return fresh

    def record(self, image: Any, content_hash: str, tenant: str | None) -> bool:
        """Make ``image`` canonical (store pixels, index it); ``False`` if not kept."""
        key = image_store_key(self.namespace_digest, tenant, content_hash)
        if self.index.get(key) is not None:
            return True
        # owned: image_to_tensors made a fresh copy no one else holds (no second copy)
        if not self.store.put(key, image_to_tensors(image), tenant=tenant, owned=True):
            logger.warning("image tier: canonical image %s not stored", content_hash[:12])
            return False
        vec = self.embedder.embed([image], [content_hash])[0]
        self.index.add(IndexEntry(key, tenant, context=content_hash), vec)
        self._maybe_save()
        return True

    def flush(self) -> None:
        """Persist the index if it changed."""
        if self.index.dirty:
            self.index.save()
            self._last_save = time.monotonic()

    def _maybe_save(self) -> None:
        if (self.index.dirty >= SAVE_EVERY
                or time.monotonic() - self._last_save >= SAVE_INTERVAL_S):
            self.flush()

    def _evicted(self, key: str) -> None:
        with self._prepared_lock:
            self._prepared.pop(key, None)
        if self.index.remove([key]):
            logger.debug("image tier: canonical image %s evicted, index entry removed", key[:12])
