"""The lookup cascade: which tiers are asked, in which order, and what a hit does.

This is the only module that knows the tier order (the seeds'): exact text (L0.5), image
embedding (L2: vision, then prompt layer), semantic text (L1). Tiers only look up; the
cascade turns a hit into a rewrite of the request (canonical images, canonical question or
prompt) so that everything below (vLLM's prefix and encoder caches, the persistent KV
store) hits exactly, and reports each rewrite with its score.
"""

from __future__ import annotations

import dataclasses

import logging
from dataclasses import dataclass, field
from typing import Any, Literal, Sequence

from vlmcache.keys import KVRowKeys
from vlmcache.tiers import calibration
from vlmcache.tiers.exact import ExactRecord, ExactTextTier
from vlmcache.tiers.gates import check_paraphrase
from vlmcache.tiers.image_embedding import ImageEmbeddingTier
from vlmcache.tiers.video import VideoQuery, VideoTier, canonical_videos
from vlmcache.tiers.semantic_text import (
    PROMPT_LAYER,
    QUESTION_LAYER,
    SemanticTextTier,
    TextLookup,
    TextQuery,
    image_context,
    strip_placeholders,
)

logger = logging.getLogger(__name__)

TierStatus = Literal["hit", "miss", "skip"]
VISION_LAYER = "embedding:vision"
VIDEO_LAYER = "video:near_duplicate"

#: Status names in the order the cascade consults them (the seeds' log-line order).
STATUS_ORDER = ("exact_text", VISION_LAYER, PROMPT_LAYER, QUESTION_LAYER, VIDEO_LAYER, "fusion",
                "kv_cache")
#: The serving front's response tier, asked before the cascade (logged first).
RESPONSE_TIER = "response"


@dataclass(frozen=True)
class CascadeRequest:
    """What the cascade sees of one request."""

    prompt: str
    image_hashes: tuple[str, ...] = ()
    tenant: str | None = None
    images: tuple[Any, ...] = ()
    question: str | None = None
    video_hashes: tuple[str, ...] = ()
    videos: tuple[VideoQuery, ...] = ()  # for the near-duplicate video tier

    @property
    def question_text(self) -> str:
        """The text L1 compares: ``question``, else the prompt without placeholders."""
        return self.question if self.question is not None else strip_placeholders(self.prompt)


@dataclass(frozen=True)
class Rewrite:
    """Audit of a similarity rewrite: what the request was canonicalized to, and why."""

    tier: str
    canonical_prompt: str
    canonical_question: str | None = None
    question_score: float | None = None
    canonical_images: tuple[str, ...] = ()
    image_scores: tuple[float, ...] = ()
    refused: tuple[str, ...] = ()


@dataclass(frozen=True)
class Resolution:
    """A request after the cascade: what to send to vLLM, and why.

    ``image_hashes`` are the (canonical) content hashes of the images to send; ``images``
    replaces the request's images when an image was canonicalized (``None``: unchanged).
    ``matched`` has the ``canonical_prompt`` of the exact record or rewrite that decided.
    """

    prompt: str
    hit_tier: str | None
    similarity: float | None
    statuses: dict[str, TierStatus] = field(default_factory=dict)
    matched: ExactRecord | Rewrite | None = None
    image_hashes: tuple[str, ...] = ()
    images: tuple[Any, ...] | None = None
    rewrite: Rewrite | None = None
    video_hashes: tuple[str, ...] = ()
    video_urls: tuple[str | None, ...] = ()  # canonical videos' URLs (None: as sent)
    video_distances: tuple[float, ...] = ()

    @property
    def rewritten(self) -> bool:
        return self.matched is not None

    @property
    def media_hashes(self) -> tuple[str, ...]:
        """Every medium the prompt holds, images then videos: what an exact record and a
        paraphrase's context are bound to."""
        return self.image_hashes + self.video_hashes


@dataclass(frozen=True)
class Candidates:
    """The best similarity candidates of a request, whatever their scores.

    ``image_score``/``image_canonical``: the best same-tenant canonical image (its content
    hash); an image that is itself canonical is its own candidate at 1.0. With several
    images, the lowest of their best scores and the first image's canonical (all of them in
    ``image_canonicals``); ``None`` when an image has no candidate. ``text_*``: the best of
    the prompt and question layers, about the canonical images if the image tier would
    canonicalize them (every best score at or above its threshold, as :meth:`Cascade.resolve`
    decides), else about the request's own. ``gate_refused``: the paraphrase gate's verdict
    on that text candidate, whether or not the tier has the gate on (``False`` without one).
    """

    image_score: float | None
    image_canonical: str | None
    text_score: float | None
    text_question: str | None
    text_prompt: str | None
    gate_refused: bool
    image_canonicals: tuple[str, ...] = ()


@dataclass(frozen=True)
class _Canonical:
    hashes: tuple[str, ...]
    images: tuple[Any, ...]
    scores: tuple[float, ...]
    status: TierStatus

    @property
    def changed(self) -> bool:
        return self.status == "hit"


class Cascade:
    """Exact, then image embedding, then semantic text; each tier optional (``None``).

    The response tier (:mod:`vlmcache.tiers.response`) is asked before these, by the
    serving front, on the request as sent.
    """

    def __init__(self, exact: ExactTextTier | None, image: ImageEmbeddingTier | None = None,
                 text: SemanticTextTier | None = None, video: VideoTier | None = None) -> None:
        self.exact = exact
        self.image = image
        self.text = text
        self.video = video

    def resolve(self, prompt: str, image_hashes: Sequence[str], tenant: str | None,
                *, images: Sequence[Any] = (), question: str | None = None,
                video_hashes: Sequence[str] = (),
                videos: Sequence[VideoQuery] = ()) -> Resolution:
        """The request as it should reach vLLM (only side effect: embedding memo).

        Videos (``video_hashes``: their sampled frames) are canonicalized first when the
        video tier verifies a near-duplicate (``videos``); every later tier binds to the
        canonical identities."""
        req = CascadeRequest(prompt, tuple(image_hashes), tenant, tuple(images), question,
                             tuple(video_hashes), tuple(videos))
        vids = canonical_videos(self.video, req.videos, req.video_hashes, tenant)
        res = self._resolve(dataclasses.replace(req, video_hashes=vids.hashes))
        if self.video is not None:
            res.statuses[VIDEO_LAYER] = vids.status
        tier = VIDEO_LAYER if vids.changed and res.hit_tier in (None, "text:exact") \
            else res.hit_tier
        return dataclasses.replace(res, hit_tier=tier, video_hashes=vids.hashes,
                                   video_urls=vids.urls, video_distances=vids.distances)

    def has_similarity_lookups(self, images: bool) -> bool:
        """Whether resolving a request without videos (with ``images`` or not) embeds or
        searches anything: the part of the front's time worth overlapping with the engine
        on a miss."""
        return self.text is not None or (images and self.image is not None)

    def _resolve(self, req: CascadeRequest) -> Resolution:
        statuses = self._initial_statuses()
        hit = self._exact(req, req.image_hashes, statuses)
        if hit is not None:
            return Resolution(hit.canonical_prompt, "text:exact", 1.0, statuses, hit,
                              req.image_hashes)
        canon = self._canonical_images(req)
        if self.image is not None:
            statuses[VISION_LAYER] = canon.status
        images = canon.images if canon.changed else None
        if canon.changed:
            hit = self._exact(req, canon.hashes, {})
            if hit is not None:
                return self._vision_hit(hit.canonical_prompt, canon, hit, statuses)
        found = self._text(req, canon, statuses)
        if found.match is not None:
            m = found.match
            prompt = _rewrite_prompt(req, m.question, m.prompt, m.layer)
            rw = Rewrite(m.layer, prompt, m.question, m.score, canon.hashes, canon.scores,
                         found.refused)
            return Resolution(prompt, m.layer, m.score, statuses, rw, canon.hashes, images, rw)
        if canon.changed:
            return self._vision_hit(req.prompt, canon, None, statuses, found.refused)
        return Resolution(req.prompt, None, None, statuses, None, canon.hashes, None,
                          Rewrite("", req.prompt, refused=found.refused) if found.refused
                          else None)

    def best_candidates(self, prompt: str, image_hashes: Sequence[str], tenant: str | None,
                        *, images: Sequence[Any] = (), question: str | None = None,
                        video_hashes: Sequence[str] = ()) -> Candidates:
        """The best image and text candidates, ignoring thresholds and the gate.

        For threshold sweeps: no side effects besides the embedding memo (no pixels
        loaded, no stale entries removed). The exact tier is not consulted.
        """
        req = CascadeRequest(prompt, tuple(image_hashes), tenant, tuple(images), question,
                             tuple(video_hashes))
        canon: tuple[str, ...] = ()
        score = None
        if self.image is not None and req.images:
            found = [self.image.best(im, h, req.tenant)
                     for im, h in zip(req.images, req.image_hashes)]
            if all(m is not None for m in found):
                canon = tuple(m.canonical_hash for m in found if m is not None)
                score = min(m.score for m in found if m is not None)
        hit = score is not None and self.image is not None and score >= self.image.threshold
        context = canon if hit else req.image_hashes
        text = None
        if self.text is not None:
            text = self.text.best(TextQuery(req.question_text, req.prompt,
                                            image_context(context + req.video_hashes),
                                            req.tenant),
                                  (PROMPT_LAYER, QUESTION_LAYER))
        refused = text is not None and not check_paraphrase(req.question_text, text.question).ok
        return Candidates(score, canon[0] if canon else None,
                          text.score if text else None, text.question if text else None,
                          text.prompt if text else None, refused, canon)

    def capture(self, prompt: str, image_hashes: Sequence[str], tenant: str | None,
                chunk_keys: Sequence[str], prompt_tokens: int) -> None:
        """Record a served request's KV keys so later ones can be canonicalized to it."""
        if self.exact is not None:
            self.exact.record(prompt, image_hashes, tenant, chunk_keys, prompt_tokens)

    def record_served(self, res: Resolution, tenant: str | None, row_keys: KVRowKeys,
                      prompt_tokens: int) -> None:
        """After a request was served: record its KV keys under the prompt vLLM got, unless
        an exact or text record decided it (that record already names the prompt; a GPU
        hit on it would only rewrite the same record and append it to the tier's log, and
        its store keys are not even derived: 41 SHA-256s on a 665-token prompt's return)."""
        if self.exact is None or res.hit_tier not in (None, VISION_LAYER, VIDEO_LAYER):
            return  # nothing would take the keys: they are not derived
        if row_keys.store_keys:
            self.capture(res.prompt, res.media_hashes, tenant, row_keys.store_keys,
                         prompt_tokens)

    def remember(self, req: CascadeRequest, res: Resolution) -> None:
        """Make a served request's images and question canonical where they were not."""
        if self.image is not None and res.statuses.get(VISION_LAYER) == "miss":
            for image, h in zip(req.images, res.image_hashes):
                self.image.record(image, h, req.tenant)
        if self.video is not None and res.statuses.get(VIDEO_LAYER) == "miss":
            for video in req.videos:
                self.video.record(video, req.tenant)
        if self.text is not None and res.hit_tier in (None, VISION_LAYER, VIDEO_LAYER):
            self.text.record(TextQuery(req.question_text, res.prompt,
                                       image_context(res.media_hashes), req.tenant))

    def flush(self) -> None:
        """Persist the similarity tiers' indexes."""
        for tier in (self.image, self.text):
            if tier is not None:
                tier.flush()

    def _initial_statuses(self) -> dict[str, TierStatus]:
        """``skip`` for every configured tier (unconfigured ones are not reported)."""
        statuses: dict[str, TierStatus] = {"exact_text": "skip"}
        if self.image is not None:
            statuses[VISION_LAYER] = "skip"
        if self.text is not None:
            statuses.update({PROMPT_LAYER: "skip", QUESTION_LAYER: "skip"})
        return statuses

    def _exact(self, req: CascadeRequest, hashes: tuple[str, ...],
               statuses: dict[str, TierStatus]) -> ExactRecord | None:
        if self.exact is None:
            return None
        record = self.exact.lookup(req.prompt, hashes + req.video_hashes, req.tenant)
        statuses["exact_text"] = "hit" if record is not None else "miss"
        return record

    def _canonical_images(self, req: CascadeRequest) -> _Canonical:
        if self.image is None or not req.images:
            return _Canonical(req.image_hashes, req.images, (), "skip")
        matches = [self.image.lookup(im, h, req.tenant)
                   for im, h in zip(req.images, req.image_hashes)]
        if any(m is None for m in matches):
            return _Canonical(req.image_hashes, req.images, (), "miss")
        hashes = tuple(m.canonical_hash for m in matches if m is not None)
        changed = hashes != req.image_hashes
        return _Canonical(hashes, tuple(m.image for m in matches if m is not None),
                          tuple(m.score for m in matches if m is not None),
                          "hit" if changed else "miss")

    def _text(self, req: CascadeRequest, canon: _Canonical,
              statuses: dict[str, TierStatus]) -> TextLookup:
        if self.text is None:
            return TextLookup(None, {})
        query = TextQuery(req.question_text, req.prompt,
                          image_context(canon.hashes + req.video_hashes), req.tenant)
        found = self.text.lookup(query, (PROMPT_LAYER, QUESTION_LAYER))
        for layer in (PROMPT_LAYER, QUESTION_LAYER):
            won = found.match is not None and found.match.layer == layer
            statuses[layer] = "hit" if won else "miss"
        if found.refused:
            logger.info("paraphrase gate refused: %s", "; ".join(found.refused))
        return found

    @staticmethod
    def _vision_hit(prompt: str, canon: _Canonical, record: ExactRecord | None,
                    statuses: dict[str, TierStatus],
                    refused: tuple[str, ...] = ()) -> Resolution:
        rw = Rewrite(VISION_LAYER, prompt, canonical_images=canon.hashes,
                     image_scores=canon.scores, refused=refused)
        return Resolution(prompt, VISION_LAYER, min(canon.scores), statuses, record or rw,
                          canon.hashes, canon.images, rw)


def _rewrite_prompt(req: CascadeRequest, cached_question: str, cached_prompt: str,
                    layer: str) -> str:
    """Replace only the question (L1 with an explicit question), else the whole prompt."""
    if layer == QUESTION_LAYER and req.question and req.question in req.prompt:
        return req.prompt.replace(req.question, cached_question, 1)
    return cached_prompt


def build_cascade(config: Any, namespace_digest: str) -> Cascade:
    """The tiers ``config`` (a :class:`~vlmcache.config.VlmCacheConfig`) enables.

    Embedders load lazily: building costs no model load, only index files are read.
    """
    root = config.store_dir
    exact = None
    if config.enable_exact:
        exact = ExactTextTier(root / "exact" / f"{namespace_digest[:24]}.jsonl",
                              namespace_digest, config.exact_max_entries)
    image = _image_tier(config, namespace_digest) if config.enable_image_embedding else None
    text = None
    if config.enable_semantic_text:
        from vlmcache.embedders import Memoized, make_text_embedder, text_digest

        embedder = Memoized(make_text_embedder("minilm"), text_digest)
        text = SemanticTextTier(root / "semantic", namespace_digest, embedder,
                                {QUESTION_LAYER: config.semantic_text_threshold,
                                 PROMPT_LAYER: config.prompt_threshold},
                                config.enable_gates, config.vector_index_hnsw_threshold,
                                facet_threshold=calibration.threshold(  # issue 13
                                    "semantic_facet", config.semantic_facet_threshold,
                                    config.max_false_hit_rate, config.calibration_file))
    video = None
    if config.enable_video_near_duplicates:  # issue 34
        video = VideoTier(calibration.threshold("image_verify", config.image_verify_threshold,
                                                config.max_false_hit_rate,
                                                config.calibration_file),
                          config.video_store_budget)
    cascade = Cascade(exact, image, text, video)
    from vlmcache.shared.sync import share_cascade  # issue 14B

    share_cascade(cascade, config, namespace_digest)  # issue 14B: no-op without redis_url
    return cascade


def _image_tier(config: Any, namespace_digest: str) -> ImageEmbeddingTier:
    from vlmcache.embedders import Memoized, make_image_embedder
    from vlmcache.keys import image_content_hash
    from vlmcache.store.disk import DiskStore
    from vlmcache.store.memory import MemoryStore
    from vlmcache.store.policy import memory_policy, tenant_quota_bytes
    from vlmcache.store.tiered import TieredStore

    budget = config.image_store_budget
    memory_budget = max(1, min(budget // 4, 256 * 1024**2))
    memory = MemoryStore(memory_budget, name="memory",
                         policy=memory_policy(config, memory_budget))
    disk = DiskStore(config.store_dir / "images", budget, name="disk",
                     protect_reused=config.eviction == "reuse",
                     tenant_quota_bytes=tenant_quota_bytes(config, budget))
    store = TieredStore(memory, disk, name="images")
    inner = make_image_embedder(config.image_embedder, config.image_embedder_path,
                                config.image_embedder_dim)
    path = config.store_dir / "image_index" / f"{namespace_digest[:24]}.{inner.name}"
    return ImageEmbeddingTier(path, namespace_digest, Memoized(inner, image_content_hash),
                              store, config.image_threshold, config.vector_index_hnsw_threshold,
                              verify_threshold=calibration.threshold(  # issue 13
                                  "image_verify", config.image_verify_threshold,
                                  config.max_false_hit_rate, config.calibration_file),
                              candidates=config.image_candidates,
                              shift=config.image_candidate_shift)

