"""A byte-bounded LRU chunk store on local disk: one safetensors file per chunk.

Layout under ``root``: ``chunks/<key[:2]>/<key>.safetensors`` plus ``manifest.json`` (the LRU
index: bytes, sha256 and last_used per key). Every file is written to a temp file in the same
directory, fsynced and moved into place with ``os.replace``, so readers only ever see whole
files. The manifest is a cache of the directory: on open it is reconciled with a scan, so a
crash can neither lose nor invent chunks. Several stores (threads or processes) may share a root.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path

import safetensors.torch
import torch

from vlmcache.store.base import EvictionListener, StoreStats, Tensors, tensors_nbytes
from vlmcache.store.memory import notify_evicted, snapshot_tensors

logger = logging.getLogger(__name__)

from vlmcache.store.chunkfile import (
    FORMAT_VERSION,
    MANIFEST_FORMAT,
    SUFFIX,
    _KEY_RE,
    _ChunkFault,
    _Entry,
    check_key,
    chunk_checksum,
    _header_checksum,
    _payload_bytes,
    _read_chunk,
    _read_header_file,
    _write_file,
    _tmp_path,
    _fsync_dir,
    _unlink_quiet,
    _is_stale_tmp,
    _scandir,
    _entry_from_json,
)


class DiskStore:
    """Thread-safe, crash-safe LRU store of chunks as checksummed safetensors files.

    The byte budget counts tensor payload bytes (:func:`tensors_nbytes`). Faulty files found by
    ``get`` (truncated, corrupt, foreign) are logged, deleted and reported as misses; I/O faults
    never raise. ``on_evict(key)`` is called, outside the lock, for keys evicted to make room.
    Chunks written by another store on the same root are visible to ``contains`` and ``get``.
    """

    def __init__(
        self,
        root: Path,
        capacity_bytes: int,
        name: str = "disk",
        on_evict: EvictionListener | None = None,
        manifest_every: int = 64,
    ) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        if manifest_every < 1:
            raise ValueError(f"manifest_every must be >= 1, got {manifest_every}")
        self.name = name
        self.root = Path(root)
        self.capacity_bytes = capacity_bytes
        self.manifest_every = manifest_every
        self._chunks = self.root / "chunks"
        self._manifest_path = self.root / "manifest.json"
        self._lock = threading.Lock()
        self._manifest_lock = threading.Lock()
        self._index: OrderedDict[str, _Entry] = OrderedDict()
        self._listeners: list[EvictionListener] = [on_evict] if on_evict is not None else []
        self._occupancy = 0
        self._clock = 0.0
        self._hits = self._misses = self._evictions = self._errors = 0
        self._bytes_read = self._bytes_written = self._puts_since_flush = 0
        self._chunks.mkdir(parents=True, exist_ok=True)
        self._open()

    def add_eviction_listener(self, listener: EvictionListener) -> None:
        """Also call ``listener(key)`` for every key evicted to make room."""
        with self._lock:
            self._listeners.append(listener)

    def path_for(self, key: str) -> Path:
        """Where the chunk ``key`` lives (raises ``ValueError`` for a malformed key)."""
        check_key(key)
        return self._chunks / key[:2] / f"{key}{SUFFIX}"

    def contains(self, key: str) -> bool:
        """Indexed here, or written by another store on this root; no stats, no LRU touch."""
        path = self.path_for(key)
        with self._lock:
            if key in self._index:
                return True
        return os.path.exists(path)

    def touch(self, key: str) -> bool:
        """Mark ``key`` most recently used without reading it; ``True`` when indexed."""
        check_key(key)
        with self._lock:
            entry = self._index.get(key)
            if entry is None:
                return False
            entry.last_used = self._stamp_locked()
            self._index.move_to_end(key)
            return True

    def get(self, key: str) -> dict[str, torch.Tensor] | None:
        """The verified chunk, or ``None`` on a miss or a fault (logged; the file is deleted)."""
        path = self.path_for(key)
        with self._lock:
            entry = self._index.get(key)
        try:
            tensors, sha, nbytes = _read_chunk(key, path)
        except FileNotFoundError:
            return self._missing(key, entry)
        except _ChunkFault as fault:
            return self._fault(key, path, entry, str(fault))
        except OSError as exc:
            return self._fault(key, path, entry, f"I/O error: {exc}")
        self._accept(key, entry, sha, nbytes)
        return tensors

    def put(self, key: str, tensors: Tensors) -> bool:
        """Write the chunk atomically, evicting LRU chunks; ``False`` if too large or on faults."""
        path = self.path_for(key)
        nbytes = tensors_nbytes(tensors)
        if nbytes > self.capacity_bytes:
            logger.debug("%s: chunk %s (%d B) exceeds capacity", self.name, key, nbytes)
            return False
        copies = snapshot_tensors(tensors)
        sha = chunk_checksum(copies)
        if self._touch_if_unchanged(key, sha, path):
            return True
        meta = {"vlmcache_format": FORMAT_VERSION, "key": key, "sha256": sha}
        data = safetensors.torch.save(copies, metadata=meta)
        tmp = _tmp_path(path.parent, key)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            _write_file(tmp, data)
        except OSError as exc:
            _unlink_quiet(tmp)
            return self._put_failed(key, exc)
        return self._commit(key, tmp, path, nbytes, sha)

    def delete(self, key: str) -> bool:
        """Drop ``key`` and its file (listeners are not called); ``True`` when it was there."""
        path = self.path_for(key)
        with self._lock:
            entry = self._index.pop(key, None)
            if entry is not None:
                self._occupancy -= entry.nbytes
            removed = _unlink_quiet(path)
        return entry is not None or removed

    def keys(self) -> list[str]:
        """Indexed keys, least recently used first."""
        with self._lock:
            return list(self._index)

    def stats(self) -> StoreStats:
        """A consistent snapshot of the counters."""
        with self._lock:
            return StoreStats(
                tier=self.name, hits=self._hits, misses=self._misses, evictions=self._evictions,
                entries=len(self._index), occupancy_bytes=self._occupancy,
                capacity_bytes=self.capacity_bytes, bytes_read=self._bytes_read,
                bytes_written=self._bytes_written, errors=self._errors,
            )

    def close(self) -> None:
        """Write the manifest; the store stays usable."""
        self._write_manifest()

    # -- get / put helpers -------------------------------------------------------------------

    def _missing(self, key: str, entry: _Entry | None) -> None:
        """A miss; an indexed chunk whose file vanished (not by our own eviction) is a fault."""
        with self._lock:
            self._misses += 1
            if entry is None or self._index.get(key) is not entry:
                return None
            del self._index[key]
            self._occupancy -= entry.nbytes
            self._errors += 1
        logger.warning("%s: chunk %s is indexed but its file is missing", self.name, key)
        return None

    def _fault(self, key: str, path: Path, entry: _Entry | None, reason: str) -> None:
        """Log, count and delete a chunk file that cannot be trusted (unless replaced meanwhile)."""
        logger.warning("%s: chunk %s is unusable (%s); deleting it", self.name, key, reason)
        with self._lock:
            self._misses += 1
            self._errors += 1
            if self._index.get(key) is entry:
                if entry is not None:
                    del self._index[key]
                    self._occupancy -= entry.nbytes
                _unlink_quiet(path)
        return None

    def _accept(self, key: str, entry: _Entry | None, sha: str, nbytes: int) -> None:
        """Count a verified read; touch its entry, or adopt a file another store wrote."""
        evicted: list[str] = []
        with self._lock:
            self._hits += 1
            self._bytes_read += nbytes
            current = self._index.get(key)
            if current is not entry:  # deleted, evicted or rewritten meanwhile: leave it be
                return
            if current is not None and current.sha256 == sha:
                current.last_used = self._stamp_locked()
                self._index.move_to_end(key)
                return
            if current is not None:
                logger.debug("%s: chunk %s was rewritten by another store", self.name, key)
            evicted = self._insert_locked(key, nbytes, sha)
            listeners = list(self._listeners)
        notify_evicted(self.name, listeners, evicted)

    def _touch_if_unchanged(self, key: str, sha: str, path: Path) -> bool:
        """Skip rewriting an indexed chunk with identical content; just mark it used."""
        with self._lock:
            entry = self._index.get(key)
            if entry is None or entry.sha256 != sha or not path.exists():
                return False
            entry.last_used = self._stamp_locked()
            self._index.move_to_end(key)
            return True

    def _commit(self, key: str, tmp: Path, path: Path, nbytes: int, sha: str) -> bool:
        """Move a written temp file into place and index it (evicting for room)."""
        try:
            with self._lock:
                os.replace(tmp, path)  # the only call here that can raise OSError
                evicted = self._insert_locked(key, nbytes, sha)
                self._bytes_written += nbytes
                self._puts_since_flush += 1
                flush = self._puts_since_flush >= self.manifest_every
                listeners = list(self._listeners)
        except OSError as exc:
            _unlink_quiet(tmp)
            return self._put_failed(key, exc)
        _fsync_dir(path.parent)
        notify_evicted(self.name, listeners, evicted)
        if flush:
            self._write_manifest()
        return True

    def _put_failed(self, key: str, exc: OSError) -> bool:
        logger.warning("%s: could not write chunk %s: %s", self.name, key, exc)
        with self._lock:
            self._errors += 1
        return False

    def _insert_locked(self, key: str, nbytes: int, sha: str) -> list[str]:
        """(Re)index ``key`` as most recently used, evicting LRU chunks so it fits."""
        old = self._index.pop(key, None)
        if old is not None:
            self._occupancy -= old.nbytes
        if nbytes > self.capacity_bytes:  # only for adopted foreign chunks: serve, don't index
            return []
        evicted = self._evict_locked(nbytes)
        self._index[key] = _Entry(nbytes, sha, self._stamp_locked())
        self._occupancy += nbytes
        return evicted

    def _evict_locked(self, incoming: int) -> list[str]:
        """Evict LRU chunks (deleting their files) until ``incoming`` more bytes fit."""
        evicted: list[str] = []
        while self._index and self._occupancy + incoming > self.capacity_bytes:
            key, entry = self._index.popitem(last=False)
            self._occupancy -= entry.nbytes
            self._evictions += 1
            _unlink_quiet(self._chunks / key[:2] / f"{key}{SUFFIX}")
            evicted.append(key)
        return evicted

    def _stamp_locked(self) -> float:
        """A strictly increasing wall-clock time, so LRU order survives a manifest round trip."""
        self._clock = max(time.time(), self._clock + 1e-6)
        return self._clock

    # -- manifest and recovery ---------------------------------------------------------------

    def _write_manifest(self) -> bool:
        """Atomically replace the manifest with the current index; ``False`` on I/O faults."""
        with self._manifest_lock:
            with self._lock:
                entries = {
                    k: {"bytes": e.nbytes, "sha256": e.sha256, "last_used": e.last_used}
                    for k, e in self._index.items()
                }
                self._puts_since_flush = 0
            manifest = {"format": MANIFEST_FORMAT, "entries": entries}
            data = json.dumps(manifest, separators=(",", ":"))
            tmp = _tmp_path(self.root, "manifest")
            try:
                _write_file(tmp, data.encode())
                os.replace(tmp, self._manifest_path)
            except OSError as exc:
                _unlink_quiet(tmp)
                logger.warning("%s: could not write the manifest: %s", self.name, exc)
                with self._lock:
                    self._errors += 1
                return False
        _fsync_dir(self.root)
        return True

    def _load_manifest(self) -> dict[str, _Entry]:
        """Entries of a readable manifest; an unreadable one is ignored (the scan rebuilds it)."""
        try:
            raw = json.loads(self._manifest_path.read_bytes())
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            logger.warning("%s: ignoring unreadable manifest: %s", self.name, exc)
            return {}
        items = raw.get("entries") if isinstance(raw, dict) else None
        if not isinstance(items, dict) or raw.get("format") != MANIFEST_FORMAT:
            logger.warning("%s: ignoring manifest of unknown format", self.name)
            return {}
        entries = {key: _entry_from_json(key, item) for key, item in items.items()}
        return {key: entry for key, entry in entries.items() if entry is not None}

    def _scan(self) -> set[str]:
        """Keys of the chunk files on disk; stale temp files are removed on the way."""
        found: set[str] = set()
        for item in _scandir(self.root):
            if item.is_file() and _is_stale_tmp(item):
                _unlink_quiet(Path(item.path))
        for shard in _scandir(self._chunks):
            if not shard.is_dir():
                continue
            for item in _scandir(Path(shard.path)):
                key = item.name[: -len(SUFFIX)] if item.name.endswith(SUFFIX) else ""
                if key and _KEY_RE.fullmatch(key) and key[:2] == shard.name:
                    found.add(key)
                elif _is_stale_tmp(item):
                    logger.info("%s: removing stale temp file %s", self.name, item.path)
                    _unlink_quiet(Path(item.path))
        return found

    def _entry_from_file(self, key: str) -> _Entry | None:
        """Index entry for a chunk file the manifest does not know, from its header and stat."""
        path = self.path_for(key)
        try:
            header = _read_header_file(path)
            sha = _header_checksum(header, key)
            entry = _Entry(_payload_bytes(header), sha, path.stat().st_mtime)
        except _ChunkFault as fault:
            logger.warning("%s: chunk %s is unusable (%s); deleting it", self.name, key, fault)
            with self._lock:
                self._errors += 1
            _unlink_quiet(path)
            return None
        except OSError as exc:
            logger.warning("%s: skipping unreadable chunk %s: %s", self.name, key, exc)
            return None
        return entry

    def _open(self) -> None:
        """Rebuild the index from the manifest and a directory scan, then enforce the budget."""
        manifest = self._load_manifest()
        found = self._scan()
        entries: list[tuple[str, _Entry]] = []
        for key in found:
            entry = manifest.get(key) or self._entry_from_file(key)
            if entry is not None:
                entries.append((key, entry))
        gone = len(manifest.keys() - found)
        if gone or len(found) != len(manifest):
            logger.info("%s: reconciled: %d chunks on disk, %d manifest entries dropped",
                        self.name, len(found), gone)
        entries.sort(key=lambda item: item[1].last_used)
        with self._lock:
            for key, entry in entries:
                self._index[key] = entry
                self._occupancy += entry.nbytes
                self._clock = max(self._clock, entry.last_used)
            evicted = self._evict_locked(0)
            listeners = list(self._listeners)
        notify_evicted(self.name, listeners, evicted)
