"""A FAISS inner-product index with string keys, metadata, removal and crash-safe persistence.

Exact search (``IndexFlatIP``) while small; past ``hnsw_threshold`` live entries the index is
rebuilt as ``IndexHNSWFlat`` (``None``: always exact, for indexes only searched by scope).
Every entry belongs to a *scope* (``scope_of(entry)``, e.g. its tenant, or tenant and
images); :meth:`VectorIndex.search_scope` searches one scope without scanning the others:
a small scope by an exact product over its own rows, a large one through FAISS with an ID
selector, a scope holding every entry by a plain search. Rows are never removed from FAISS in place: a removed key's row
is a tombstone (filtered out of results) until the next rebuild, which happens when
tombstones outnumber live rows.

On disk, ``<name>.json`` (keys and metadata per row) names ``<name>.<digest>.faiss`` (the
serialized index, by content digest). Both are written to temp files and renamed, the FAISS
file first, so the JSON always names a complete index; a mismatch on load is a fresh index.
No pickle: FAISS's own serialization and JSON.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Sequence

import numpy as np

from vlmcache.errors import require
from vlmcache.store.chunkfile import _open_read, write_private_file

logger = logging.getLogger(__name__)

FORMAT = "vlmcache-vindex-v1"
#: Scopes up to this many rows are searched exactly over their own rows.
SMALL_SCOPE = 2048


@contextmanager
def one_omp_thread(faiss: Any) -> Iterator[None]:
    """Run FAISS's OpenMP regions on the calling thread alone while inside.

    A search here is one query vector: FAISS's parallel region then has nothing to share
    out but still wakes the OpenMP workers, which spin-wait after it (issue 35: a search
    of 300 rows took 0.21 ms and 0.10 ms of CPU; on one thread 0.13 and 0.06, 2 cores).
    ``omp_set_num_threads`` sets the calling thread's own setting, so other threads
    (a rebuild in the recorder thread) keep theirs; the results are the same.
    """
    before = faiss.omp_get_max_threads()
    if before == 1:
        yield
        return
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


@dataclass(frozen=True)
class IndexEntry:
    """What one vector stands for: a key plus the metadata searches filter on."""

    key: str
    tenant: str | None
    context: str = ""
    text: str = ""
    aux: str = ""


@dataclass(frozen=True)
class SearchHit:
    """One result: the entry and its inner-product score (cosine for unit vectors)."""

    entry: IndexEntry
    score: float


class VectorIndex:
    """Thread-safe key -> vector index for one modality and namespace.

    Args:
        dim: vector size.
        path: ``<dir>/<name>`` stem to persist to; ``None`` keeps it in memory only.
        hnsw_threshold: live entries past which an HNSW index replaces exact search.
        hnsw_m: HNSW graph degree.
    """

    def __init__(self, dim: int, path: Path | None = None,
                 hnsw_threshold: Optional[int] = 20_000, hnsw_m: int = 32,
                 scope_of: Callable[[IndexEntry], str] | None = None) -> None:
        self.faiss = require("faiss", "semantic")
        self.dim, self.path = dim, path
        self.hnsw_threshold, self.hnsw_m = hnsw_threshold, hnsw_m
        self.scope_of = scope_of or (lambda e: str(e.tenant))
        self._lock = threading.Lock()
        self._rows: list[IndexEntry | None] = []
        self._by_key: dict[str, int] = {}
        self._scopes: dict[str, set[int]] = {}
        self._index = self._new_index(0)
        self._dirty = 0
        if path is not None:
            self._load()

    @property
    def kind(self) -> str:
        """``"flat"`` (exact) or ``"hnsw"``."""
        return "hnsw" if isinstance(self._index, self.faiss.IndexHNSWFlat) else "flat"

    def __len__(self) -> int:
        return len(self._by_key)

    @property
    def dirty(self) -> int:
        """Changes since the last save."""
        return self._dirty

    def add(self, entry: IndexEntry, vector: np.ndarray) -> None:
        """Add (or replace) ``entry.key`` with a unit ``vector``."""
        self.add_many([entry], vector)

    def add_many(self, entries: Sequence[IndexEntry], vectors: np.ndarray) -> None:
        """Add (or replace) several entries in one FAISS call (rows of ``vectors``)."""
        vecs = np.ascontiguousarray(np.asarray(vectors, np.float32).reshape(-1, self.dim))
        if len(vecs) != len(entries):
            raise ValueError(f"{len(entries)} entries for {len(vecs)} vectors")
        with self._lock:
            for entry in entries:
                self._drop_locked(entry.key)
            grow = self.kind == "hnsw" or not self._crosses_locked(len(entries))
            if grow:
                self._index.add(vecs)
            for entry in entries:
                self._rows.append(entry)
                self._index_row_locked(len(self._rows) - 1)
            self._dirty += len(entries)
            if not grow:  # flat -> HNSW: build the graph once, from every live row
                self._rebuild_locked(np.concatenate([self._all_vectors_locked(), vecs]))
            self._maybe_rebuild_locked()

    def remove(self, keys: Sequence[str]) -> int:
        """Remove entries by key; returns how many were present."""
        with self._lock:
            n = sum(self._drop_locked(k) for k in keys)
            self._dirty += n
            self._maybe_rebuild_locked()
            return n

    def remove_where(self, predicate: Callable[[IndexEntry], bool]) -> int:
        """Remove every entry for which ``predicate`` holds."""
        with self._lock:
            keys = [e.key for e in self._rows if e is not None and predicate(e)]
        return self.remove(keys)

    def get(self, key: str) -> IndexEntry | None:
        with self._lock:
            row = self._by_key.get(key)
            return None if row is None else self._rows[row]

    def has_scope(self, scope: str) -> bool:
        """Whether ``scope`` has a live entry (a search there can find something)."""
        with self._lock:
            return bool(self._scopes.get(scope))

    def search_scope(self, vector: np.ndarray, scope: str, k: int = 1) -> list[SearchHit]:
        """The ``k`` best live entries of ``scope``, best first (no scan of other scopes)."""
        vec = np.ascontiguousarray(np.asarray(vector, np.float32).reshape(1, self.dim))
        with self._lock, one_omp_thread(self.faiss):
            rows = self._scopes.get(scope)
            if not rows:
                return []
            if len(rows) == len(self._by_key):  # every entry: a plain search
                return self._search_all_locked(vec, k)
            ids = np.fromiter(rows, np.int64, len(rows))
            if len(ids) <= SMALL_SCOPE:
                scores = self._index.reconstruct_batch(ids) @ vec[0]
                top = np.argsort(-scores)[:k]
                return [SearchHit(self._rows[int(ids[i])], float(scores[i]))  # type: ignore[arg-type]
                        for i in top]
            params = self._selector_params(ids)
            scores, found = self._index.search(vec, min(k, len(ids)), params=params)
            return [SearchHit(self._rows[int(r)], float(s))  # type: ignore[arg-type]
                    for s, r in zip(scores[0], found[0]) if r >= 0 and self._rows[int(r)]]

    def search(self, vector: np.ndarray, k: int = 1,
               accept: Callable[[IndexEntry], bool] | None = None) -> list[SearchHit]:
        """The ``k`` best live entries that ``accept`` admits, best first."""
        vec = np.ascontiguousarray(np.asarray(vector, np.float32).reshape(1, self.dim))
        with self._lock, one_omp_thread(self.faiss):
            total = self._index.ntotal
            probe = min(total, max(16, 4 * k))
            while probe > 0:
                hits = self._search_locked(vec, probe, accept)
                if len(hits) >= k or probe >= total:
                    return hits[:k]
                probe = min(total, probe * 4)
            return []

    def save(self) -> bool:
        """Persist atomically (no-op without ``path``); ``False`` on an I/O fault (logged:
        the index stays in memory and dirty, so the next save tries again)."""
        if self.path is None:
            return True
        with self._lock:
            data = self.faiss.serialize_index(self._index).tobytes()
            rows = [None if e is None else asdict(e) for e in self._rows]
            dirty, self._dirty = self._dirty, 0
        try:
            self._write(data, rows)
        except OSError as exc:  # a full disk, a planted symlink: a cache fault, never raised
            logger.warning("vector index %s: cannot save (%s); kept in memory", self.path, exc)
            with self._lock:
                self._dirty += max(dirty, 1)
            return False
        return True

    def _write(self, data: bytes, rows: list[dict[str, object] | None]) -> None:
        """The index blob, then the metadata naming it (private files, see
        :func:`~vlmcache.store.chunkfile.write_private_file`); older blobs are removed."""
        assert self.path is not None
        digest = hashlib.sha256(data).hexdigest()[:24]
        blob = self.path.with_name(f"{self.path.name}.{digest}.faiss")
        write_private_file(blob, data, stem="index")
        meta = {"format": FORMAT, "dim": self.dim, "faiss": blob.name, "sha256": digest,
                "rows": rows}
        write_private_file(self._meta_path(), json.dumps(meta).encode(), stem="meta")
        for old in self.path.parent.glob(f"{self.path.name}.*.faiss"):
            if old != blob:
                old.unlink(missing_ok=True)

    def _meta_path(self) -> Path:
        assert self.path is not None
        return self.path.with_name(self.path.name + ".json")

    def _new_index(self, live: int) -> object:
        if self.hnsw_threshold is not None and live > self.hnsw_threshold:
            index = self.faiss.IndexHNSWFlat(self.dim, self.hnsw_m, self.faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efSearch = max(64, self.hnsw_m * 2)
            return index
        return self.faiss.IndexFlatIP(self.dim)

    def _drop_locked(self, key: str) -> bool:
        row = self._by_key.pop(key, None)
        if row is None:
            return False
        entry = self._rows[row]
        scope = self.scope_of(entry) if entry is not None else ""
        self._scopes.get(scope, set()).discard(row)
        if not self._scopes.get(scope, True):
            del self._scopes[scope]
        self._rows[row] = None
        return True

    def _index_row_locked(self, row: int) -> None:
        entry = self._rows[row]
        if entry is not None:
            self._by_key[entry.key] = row
            self._scopes.setdefault(self.scope_of(entry), set()).add(row)

    def _crosses_locked(self, n: int) -> bool:
        """Whether ``n`` more live rows take a flat index past the HNSW threshold."""
        return (self.hnsw_threshold is not None
                and len(self._by_key) + n > self.hnsw_threshold)

    def _all_vectors_locked(self) -> np.ndarray:
        return self._index.reconstruct_n(0, self._index.ntotal)

    def _selector_params(self, ids: np.ndarray) -> object:
        sel = self.faiss.IDSelectorBatch(ids)
        if self.kind == "hnsw":
            return self.faiss.SearchParametersHNSW(sel=sel, efSearch=max(64, 2 * self.hnsw_m))
        return self.faiss.SearchParameters(sel=sel)

    def _search_all_locked(self, vec: np.ndarray, k: int) -> list[SearchHit]:
        total = self._index.ntotal
        probe = min(total, max(16, 4 * k))
        while True:
            hits = self._search_locked(vec, probe, None)
            if len(hits) >= k or probe >= total:
                return hits[:k]
            probe = min(total, probe * 4)

    def _search_locked(self, vec: np.ndarray, probe: int,
                       accept: Callable[[IndexEntry], bool] | None) -> list[SearchHit]:
        scores, rows = self._index.search(vec, probe)
        hits = []
        for score, row in zip(scores[0], rows[0]):
            entry = self._rows[row] if 0 <= row < len(self._rows) else None
            if entry is not None and (accept is None or accept(entry)):
                hits.append(SearchHit(entry, float(score)))
        return hits

    def _maybe_rebuild_locked(self) -> None:
        live = len(self._by_key)
        tombstones = len(self._rows) - live
        wrong_kind = self._crosses_locked(0) != (self.kind == "hnsw")
        if not wrong_kind and tombstones <= max(live, 64):
            return
        self._rebuild_locked(self._all_vectors_locked())

    def _rebuild_locked(self, vectors: np.ndarray) -> None:
        """A fresh index of the live rows (``vectors``: one per row of ``_rows``)."""
        keep = [i for i, e in enumerate(self._rows) if e is not None]
        self._index = self._new_index(len(keep))
        if keep:
            self._index.add(np.ascontiguousarray(vectors[keep], dtype=np.float32))
        self._rows = [self._rows[i] for i in keep]
        self._by_key, self._scopes = {}, {}
        for row in range(len(self._rows)):
            self._index_row_locked(row)

    def _load(self) -> None:
        meta_path = self._meta_path()
        if not meta_path.is_file():
            return
        try:
            meta = json.loads(_read_no_follow(meta_path))
            data = _read_no_follow(meta_path.parent / meta["faiss"])
            if meta["format"] != FORMAT or meta["dim"] != self.dim:
                raise ValueError(f"format/dim {meta['format']}/{meta['dim']}")
            if hashlib.sha256(data).hexdigest()[:24] != meta["sha256"]:
                raise ValueError("index file digest mismatch")
            index = self.faiss.deserialize_index(np.frombuffer(data, dtype=np.uint8))
            rows = [None if r is None else IndexEntry(**r) for r in meta["rows"]]
            if index.ntotal != len(rows):
                raise ValueError(f"{index.ntotal} vectors for {len(rows)} rows")
        except (OSError, ValueError, KeyError, TypeError, RuntimeError) as exc:
            logger.warning("vector index %s unreadable (%s): starting empty", meta_path, exc)
            return
        self._index, self._rows = index, rows
        for row in range(len(rows)):
            self._index_row_locked(row)


def _read_no_follow(path: Path) -> bytes:
    """A file's bytes, never through a planted symlink (``OSError`` then)."""
    with _open_read(path) as f:
        return f.read()
