"""The embedder contract: one small Protocol per modality, plus a per-content memo.

Every embedder returns L2-normalized float32 rows, so an inner product is a cosine
similarity. Embedders load their weights lazily, on the first call to ``embed``.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor
from typing import (
    Any,
    Callable,
    Generic,
    Iterable,
    Protocol,
    Sequence,
    TypeVar,
    runtime_checkable,
)

import numpy as np

import vlmcache.cpu_share as cpu_share

T = TypeVar("T")


@runtime_checkable
class TextEmbedder(Protocol):
    """Questions/prompts -> unit vectors."""

    name: str
    dim: int

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """``(len(texts), dim)`` float32 rows of unit length."""


@runtime_checkable
class ImageEmbedder(Protocol):
    """PIL images -> unit vectors."""

    name: str
    dim: int

    def embed(self, images: Sequence[object]) -> np.ndarray:
        """``(len(images), dim)`` float32 rows of unit length."""


def normalize_rows(vectors: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (zero rows stay zero), as contiguous float32."""
    v = np.asarray(vectors, dtype=np.float32)
    if v.ndim == 1:
        v = v[None, :]
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    return np.ascontiguousarray(v / np.maximum(norms, 1e-12), dtype=np.float32)


def text_digest(text: str) -> str:
    """Content hash of a text, for memoization."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


class Memoized(Generic[T]):
    """Wraps an embedder: batches only the items not seen before (LRU by content hash).

    Args:
        inner: the embedder (``TextEmbedder`` or ``ImageEmbedder``).
        digest: content hash of one item (e.g. :func:`text_digest`,
            :func:`vlmcache.keys.image_content_hash`).
        max_entries: vectors kept.
    """

    def __init__(self, inner: TextEmbedder | ImageEmbedder, digest: Callable[[T], str],
                 max_entries: int = 4096) -> None:
        self.inner = inner
        self.name = inner.name
        self._digest = digest
        self._max = max_entries
        self._memo: OrderedDict[str, np.ndarray] = OrderedDict()
        self._pending: dict[str, Future[dict[str, np.ndarray]]] = {}
        self._lock = threading.Lock()

    @property
    def dim(self) -> int:
        return self.inner.dim

    def embed(self, items: Sequence[T], digests: Sequence[str] | None = None) -> np.ndarray:
        """Rows for ``items``; ``digests`` (same order) skips re-hashing when known. An item
        being embedded in the background (:meth:`prefetch`) is waited for, not redone."""
        keys = list(digests) if digests is not None else [self._digest(i) for i in items]
        with self._lock:
            found = {k: self._memo[k] for k in keys if k in self._memo}
            waits = {self._pending[k] for k in keys if k not in found and k in self._pending}
        for job in waits:
            try:
                found.update({k: v for k, v in job.result().items() if k in keys})
            except Exception:  # noqa: BLE001 -- the background failed: embedded below
                pass
        todo = [(k, item) for k, item in zip(keys, items) if k not in found]
        unique = dict(todo)
        if unique:
            found.update(self._embed_new(unique))
        return np.stack([found[k] for k in keys]).astype(np.float32)

    def warm_up(self, sample: T) -> None:
        """Load the inner embedder's weights now by embedding ``sample`` (not memoized):
        a server calls this before it takes requests, so that its first ones (in every
        worker process) do not each wait seconds for a lazy load."""
        self.inner.embed([sample])

    def prefetch(self, items: Sequence[T], digests: Sequence[str] | None = None) -> None:
        """Embed ``items`` on a background thread (into the memo): for what is likely to be
        embedded later (a request's record, after the engine answered), off the request's
        path."""
        keys = list(digests) if digests is not None else [self._digest(i) for i in items]
        with self._lock:
            todo = {k: item for k, item in zip(keys, items)
                    if k not in self._memo and k not in self._pending}
            if not todo:
                return
            job = _background().submit(self._embed_new, todo)
            for k in todo:
                self._pending[k] = job
        job.add_done_callback(lambda _: self._settled(todo))

    def _settled(self, keys: Iterable[str]) -> None:
        with self._lock:
            for k in keys:
                self._pending.pop(k, None)

    def _embed_new(self, unique: dict[str, T]) -> dict[str, np.ndarray]:
        rows = self.inner.embed(list(unique.values()))
        fresh = dict(zip(unique, rows))
        with self._lock:
            self._memo.update(fresh)
            while len(self._memo) > self._max:
                self._memo.popitem(last=False)
        return fresh


_BACKGROUND: ThreadPoolExecutor | None = None
_BACKGROUND_LOCK = threading.Lock()


def _background() -> ThreadPoolExecutor:
    """The thread of prefetched embeddings (one: the text model takes one call at a time;
    its own threads do the math)."""
    global _BACKGROUND
    with _BACKGROUND_LOCK:
        if _BACKGROUND is None:
            _BACKGROUND = ThreadPoolExecutor(1, thread_name_prefix="vlmcache-embed",
                                             initializer=cpu_share.thread_initializer())
        return _BACKGROUND


class LazyModel:
    """Loads a model once, under a lock, on first use."""

    def __init__(self, loader: Callable[[], Any]) -> None:
        self._loader = loader
        self._model: Any = None
        self._lock = threading.Lock()

    def get(self) -> Any:
        with self._lock:
            if self._model is None:
                self._model = self._loader()
            return self._model
