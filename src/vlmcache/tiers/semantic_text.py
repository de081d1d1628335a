"""Semantic text tiers: a paraphrased question about the same (canonical) images.

Two layers share one text embedder and differ in what they embed:

- ``embedding:prompt`` (L2, prompt layer): the whole prompt text, image placeholders
  stripped;
- ``semantic_text`` (L1): the question only (``VlmRequest.question``, else the stripped
  prompt).

Both only match cached requests of the same tenant about the same canonical images (the
*context*): each (tenant, context) is a scope of the index, searched on its own rows only
(no scan), and both pass the paraphrase gate (:mod:`vlmcache.tiers.gates`). A candidate
is accepted at the layer's threshold, or, second stage, at the lower
``facet_threshold`` when the gate recognised the question's kind and every facet and
content word agrees (:func:`~vlmcache.tiers.gates.second_stage_ok`, with the gate on). A hit names the cached question/prompt the request is rewritten to;
everything below caches exactly.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import logging
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from vlmcache.embedders.base import Memoized
from vlmcache.index.faiss_index import IndexEntry, VectorIndex
from vlmcache.tiers.exact import normalize_prompt
from vlmcache.tiers.gates import check_paraphrase, second_stage_ok

logger = logging.getLogger(__name__)

PROMPT_LAYER = "embedding:prompt"
QUESTION_LAYER = "semantic_text"
_PLACEHOLDER_RE = re.compile(r"<\|?(?:image|img|vision|video)[^>]*\|?>", re.IGNORECASE)
SAVE_EVERY = 64
SAVE_INTERVAL_S = 2.0


def strip_placeholders(prompt: str) -> str:
    """The prompt's text with image and video placeholder tokens removed."""
    return " ".join(_PLACEHOLDER_RE.sub(" ", prompt).split())


def image_context(canonical_hashes: Sequence[str]) -> str:
    """The context a text entry is bound to: its canonical images, in order."""
    return hashlib.sha256("\0".join(canonical_hashes).encode()).hexdigest()


@dataclass(frozen=True)
class TextQuery:
    """One request's text, as the text layers see it."""

    question: str
    prompt: str
    context: str
    tenant: str | None


@dataclass(frozen=True)
class TextMatch:
    """A cached request the query may be rewritten to."""

    layer: str
    question: str
    prompt: str
    score: float


@dataclass(frozen=True)
class TextLookup:
    """The best match (or ``None``), per-layer best scores and gate refusals."""

    match: TextMatch | None
    scores: dict[str, float]
    refused: tuple[str, ...] = ()


class SemanticTextTier:
    """Question (L1) and prompt (L2 prompt layer) indexes for one namespace.

    Args:
        index_dir: where the two FAISS indexes persist.
        namespace_digest: binds entries to model, weights, processor and salt.
        embedder: memoized text embedder.
        thresholds: minimum cosine per layer (``semantic_text``, ``embedding:prompt``).
        gate: refuse hits whose questions differ in negation/colour/shape/number/side.
        facet_threshold: the second stage's lower cosine (``None``: no second stage).
        hnsw_threshold: unused (kept for callers): searches are per scope, exact.
    """

    def __init__(self, index_dir: Path, namespace_digest: str, embedder: Memoized,
                 thresholds: dict[str, float], gate: bool = True,
                 hnsw_threshold: int = 20_000, facet_threshold: float | None = None) -> None:
        self.namespace_digest = namespace_digest
        self.embedder = embedder
        self.thresholds = dict(thresholds)
        self.gate = gate
        self.facet_threshold = facet_threshold
        stem = namespace_digest[:24]
        self.indexes = {layer: VectorIndex(embedder.dim, index_dir / f"{stem}.{name}",
                                           None, scope_of=entry_scope)
                        for layer, name in ((QUESTION_LAYER, "question"),
                                            (PROMPT_LAYER, "prompt"))}
        self._last_save = time.monotonic()
        atexit.register(self.flush)

    def lookup(self, query: TextQuery, layers: Sequence[str]) -> TextLookup:
        """Best gated match over ``layers`` (ties go to the later layer, L1).

        Layers with nothing recorded in the query's scope (its tenant and images: a new
        image's first question) are not searched, and the question is not embedded for
        them: a sentence embedding on the CPU is the dearest part of a miss (~10-60 ms)."""
        scope = query_scope(query)
        searched = [layer for layer in layers if self.indexes[layer].has_scope(scope)]
        prefetch = getattr(self.embedder, "prefetch", None)
        if len(searched) < len(layers) and prefetch is not None:
            texts = self._texts(query)  # what the record will embed, while the engine works
            prefetch([texts[layer] for layer in layers if layer not in searched])
        if not searched:
            return TextLookup(None, {}, ())
        layers = searched
        vecs = self._vectors(query, layers)
        best: TextMatch | None = None
        scores: dict[str, float] = {}
        refused: list[str] = []
        for layer in layers:
            floor = self._floor(layer)
            for hit in self.indexes[layer].search_scope(vecs[layer], scope, k=4):
                scores[layer] = max(scores.get(layer, -1.0), hit.score)
                if hit.score < floor:
                    break
                cached_q = json.loads(hit.entry.aux)["question"]
                reason = self._refusal(layer, query.question, cached_q, hit.score)
                if reason:
                    refused.append(f"{layer}: {reason}")
                    continue
                if best is None or hit.score >= best.score:
                    best = TextMatch(layer, cached_q, hit.entry.text, hit.score)
                break
        return TextLookup(best, scores, tuple(refused))

    def _floor(self, layer: str) -> float:
        """The lowest cosine a candidate of ``layer`` can be accepted at."""
        if self.gate and self.facet_threshold is not None:
            return min(self.thresholds[layer], self.facet_threshold)
        return self.thresholds[layer]

    def _refusal(self, layer: str, question: str, cached: str, score: float) -> str:
        """Why a candidate at ``score`` is refused ("" if it is accepted)."""
        verdict = check_paraphrase(question, cached) if self.gate else None
        if verdict is not None and not verdict.ok:
            return verdict.reason
        if score >= self.thresholds[layer]:
            return ""
        if second_stage_ok(question, cached):  # known kind, same facets and content words
            return ""
        return (f"cosine {score:.3f} below {self.thresholds[layer]}, and the kind or "
                "content words differ")

    def best(self, query: TextQuery, layers: Sequence[str]) -> TextMatch | None:
        """The best same-tenant, same-context entry over ``layers``, whatever its score.

        Thresholds and the gate are ignored (ties go to the later layer, as in
        :meth:`lookup`). No side effects besides the embedding memo.
        """
        vecs = self._vectors(query, layers)
        best: TextMatch | None = None
        for layer in layers:
            for hit in self.indexes[layer].search_scope(vecs[layer], query_scope(query), k=1):
                if best is None or hit.score >= best.score:
                    best = TextMatch(layer, json.loads(hit.entry.aux)["question"],
                                     hit.entry.text, hit.score)
        return best

    def record(self, query: TextQuery) -> None:
        """Remember ``query`` as a canonical question/prompt for its context."""
        aux = json.dumps({"question": query.question})
        texts = self._texts(query)  # a lookup's prefetch is this record's embedding
        vecs = self.embedder.embed(list(texts.values()))
        for (layer, text), vec in zip(texts.items(), vecs):
            key = self._key(layer, text, query)
            if self.indexes[layer].get(key) is None:
                entry = IndexEntry(key, query.tenant, query.context, query.prompt, aux)
                self.indexes[layer].add(entry, vec)
        self._maybe_save()

    def flush(self) -> None:
        """Persist the indexes that changed."""
        for index in self.indexes.values():
            if index.dirty:
                index.save()
        self._last_save = time.monotonic()

    def _maybe_save(self) -> None:
        dirty = max(ix.dirty for ix in self.indexes.values())
        if dirty >= SAVE_EVERY or time.monotonic() - self._last_save >= SAVE_INTERVAL_S:
            self.flush()

    def _vectors(self, query: TextQuery, layers: Sequence[str]) -> dict[str, np.ndarray]:
        """One (memoized) embedding per layer: the stripped prompt or the question."""
        texts = self._texts(query)
        return dict(zip(layers, self.embedder.embed([texts[layer] for layer in layers])))

    @staticmethod
    def _texts(query: TextQuery) -> dict[str, str]:
        return {PROMPT_LAYER: strip_placeholders(query.prompt), QUESTION_LAYER: query.question}

    def _key(self, layer: str, text: str, query: TextQuery) -> str:
        payload = json.dumps([self.namespace_digest, layer, query.tenant, query.context,
                              normalize_prompt(text)])
        return hashlib.sha256(payload.encode()).hexdigest()


def entry_scope(entry: IndexEntry) -> str:
    """An entry's scope: its tenant and the canonical images it is about."""
    return f"{entry.tenant}\0{entry.context}"


def query_scope(query: TextQuery) -> str:
    """The scope a query searches (see :func:`entry_scope`)."""
    return f"{query.tenant}\0{query.context}"
