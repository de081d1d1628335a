"""A FAISS inner-product index with string keys, metadata, removal and crash-safe persistence.

Exact search (``IndexFlatIP``) while small; past ``hnsw_threshold`` live entries the index is
rebuilt as ``IndexHNSWFlat``. Rows are never removed from FAISS in place: a removed key's row
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
import os
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from vlmcache.errors import require

logger = logging.getLogger(__name__)

FORMAT = "vlmcache-vindex-v1"


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

    def __init__(self, dim: int, path: Path | None = None, hnsw_threshold: int = 20_000,
                 hnsw_m: int = 32) -> None:
        self.faiss = require("faiss", "semantic")
        self.dim, self.path = dim, path
        self.hnsw_threshold, self.hnsw_m = hnsw_threshold, hnsw_m
        self._lock = threading.Lock()
        self._rows: list[IndexEntry | None] = []
        self._by_key: dict[str, int] = {}
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
        vec = np.ascontiguousarray(np.asarray(vector, np.float32).reshape(1, self.dim))
        with self._lock:
            self._drop_locked(entry.key)
            self._index.add(vec)
            self._rows.append(entry)
            self._by_key[entry.key] = len(self._rows) - 1
            self._dirty += 1
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

    def search(self, vector: np.ndarray, k: int = 1,
               accept: Callable[[IndexEntry], bool] | None = None) -> list[SearchHit]:
        """The ``k`` best live entries that ``accept`` admits, best first."""
        vec = np.ascontiguousarray(np.asarray(vector, np.float32).reshape(1, self.dim))
        with self._lock:
            total = self._index.ntotal
            probe = min(total, max(16, 4 * k))
            while probe > 0:
                hits = self._search_locked(vec, probe, accept)
                if len(hits) >= k or probe >= total:
                    return hits[:k]
                probe = min(total, probe * 4)
            return []

    def save(self) -> None:
        """Persist atomically (no-op without ``path``)."""
        if self.path is None:
            return
        with self._lock:
            data = self.faiss.serialize_index(self._index).tobytes()
            rows = [None if e is None else asdict(e) for e in self._rows]
            self._dirty = 0
        digest = hashlib.sha256(data).hexdigest()[:24]
        self.path.parent.mkdir(parents=True, exist_ok=True)
        blob = self.path.with_name(f"{self.path.name}.{digest}.faiss")
        _atomic_write(blob, data)
        meta = {"format": FORMAT, "dim": self.dim, "faiss": blob.name, "sha256": digest,
                "rows": rows}
        _atomic_write(self._meta_path(), json.dumps(meta).encode())
        for old in self.path.parent.glob(f"{self.path.name}.*.faiss"):
            if old != blob:
                old.unlink(missing_ok=True)

    def _meta_path(self) -> Path:
        assert self.path is not None
        return self.path.with_name(self.path.name + ".json")

    def _new_index(self, live: int) -> object:
        if live > self.hnsw_threshold:
            index = self.faiss.IndexHNSWFlat(self.dim, self.hnsw_m, self.faiss.METRIC_INNER_PRODUCT)
            index.hnsw.efSearch = max(64, self.hnsw_m * 2)
            return index
        return self.faiss.IndexFlatIP(self.dim)

    def _drop_locked(self, key: str) -> bool:
        row = self._by_key.pop(key, None)
        if row is None:
            return False
        self._rows[row] = None
        return True

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
        wrong_kind = (live > self.hnsw_threshold) != (self.kind == "hnsw")
        if not wrong_kind and tombstones <= max(live, 64):
            return
        keep = [i for i, e in enumerate(self._rows) if e is not None]
        vectors = self._index.reconstruct_n(0, self._index.ntotal)[keep] if keep else None
        self._index = self._new_index(live)
        if vectors is not None:
            self._index.add(np.ascontiguousarray(vectors, dtype=np.float32))
        self._rows = [self._rows[i] for i in keep]
        self._by_key = {e.key: i for i, e in enumerate(self._rows) if e is not None}

    def _load(self) -> None:
        meta_path = self._meta_path()
        if not meta_path.is_file():
            return
        try:
            meta = json.loads(meta_path.read_text())
            data = (meta_path.parent / meta["faiss"]).read_bytes()
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
        self._by_key = {e.key: i for i, e in enumerate(rows) if e is not None}


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
