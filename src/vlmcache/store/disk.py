"""A byte-bounded LRU chunk store on local disk: one safetensors file per chunk.

Layout under ``root``: ``chunks/<key[:2]>/<key>.safetensors``, ``manifest.json`` (an LRU-order
hint) and ``.occupancy`` (the directory's payload bytes, see :mod:`vlmcache.store.ledger`).
Every file is written to a fresh 0600 temp file (``O_EXCL|O_NOFOLLOW``) in a 0700 directory,
fsynced and moved into place with ``os.replace``, so readers only ever see whole files. Sizes
and checksums always come from the chunk files, never from the manifest. Several stores
(threads or processes) may share a root; the budget holds for the root as a whole.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from pathlib import Path
from typing import Callable, TypeVar

import safetensors.torch
import torch

from vlmcache.store.base import EvictionListener, StoreStats, Tensors, tensors_nbytes
from vlmcache.store.chunkfile import (
    FORMAT_VERSION, SUFFIX, TENANT_META, _ChunkFault, _Entry, _fsync_dir, _read_chunk, _tmp_path,
    _unlink_quiet, _write_file, check_key, chunk_checksum, file_entry, file_facts,
    make_private_dir, read_chunk_into, tenant_label, u8_checksum, u8_chunk_header,
    scan_keys,
)
from vlmcache.store.ledger import LedgerView, OccupancyLedger
from vlmcache.store.manifest import load_last_used, write_manifest
from vlmcache.store.memory import owned_tensors, notify_evicted, snapshot_tensors
from vlmcache.store.policy import TenantBytes, TenantOccupancy
from vlmcache.store.ratelog import RateLimitedWarning

logger = logging.getLogger(__name__)
_T = TypeVar("_T")

__all__ = ["DiskStore", "check_key", "chunk_checksum"]
_REUSE_WINDOW = 256


class DiskStore:
    """Thread- and process-safe, crash-safe LRU store of checksummed safetensors chunk files.

    ``protect_reused=True`` makes eviction favour chunks with reuse history (see
    :meth:`_evict_locked`). The byte budget counts tensor payload bytes (:func:`tensors_nbytes`) of every chunk under
    ``root``, whichever process wrote it. Faulty files found by ``get`` (truncated, corrupt,
    foreign, symlinks) are logged, deleted and reported as misses; I/O faults never raise.
    ``on_evict(key)`` is called, outside the lock, for keys this store evicted to make room.
    """

    def __init__(
        self,
        root: Path,
        capacity_bytes: int,
        name: str = "disk",
        on_evict: EvictionListener | None = None,
        manifest_every: int = 64,
        protect_reused: bool = False,
        tenant_quota_bytes: int = 0,
    ) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes must be >= 0, got {capacity_bytes}")
        if manifest_every < 1:
            raise ValueError(f"manifest_every must be >= 1, got {manifest_every}")
        self.name = name
        self.root = Path(root)
        self.capacity_bytes = capacity_bytes
        self.manifest_every = manifest_every
        self.protect_reused = protect_reused
        self._chunks = self.root / "chunks"
        self._manifest_path = self.root / "manifest.json"
        self._lock = threading.Lock()
        self._manifest_lock = threading.Lock()
        self._index: OrderedDict[str, _Entry] = OrderedDict()
        self._listeners: list[EvictionListener] = [on_evict] if on_evict is not None else []
        self._occupancy = 0
        self._tenants = TenantBytes(tenant_quota_bytes)
        self._clock = 0.0
        self._hits = self._misses = self._evictions = self._errors = 0
        self._bytes_read = self._bytes_written = self._puts_since_flush = 0
        self._recount_due = False
        self._write_log = RateLimitedWarning(logger, f"{name}: could not write")
        make_private_dir(self._chunks)
        self._ledger = OccupancyLedger(self.root)
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

    def size_of(self, key: str) -> int | None:
        """Bytes ``key``'s file holds (its index entry, else the file's size: a hint for a
        cost decision, never trusted for a read); ``None`` when absent."""
        with self._lock:
            entry = self._index.get(key)
        if entry is not None:
            return entry.nbytes
        try:
            return os.stat(self.path_for(key)).st_size
        except OSError:
            return None

    def touch(self, key: str) -> bool:
        """Mark ``key`` most recently used without reading it; ``True`` when indexed."""
        check_key(key)
        with self._lock:
            entry = self._index.get(key)
            if entry is None:
                return False
            entry.last_used = self._stamp_locked()
            entry.reused = True
            self._index.move_to_end(key)
            return True

    def get(self, key: str) -> dict[str, torch.Tensor] | None:
        """The verified chunk, or ``None`` on a miss or a fault (logged; the file is deleted)."""
        return self._verified_read(key, lambda path: _read_chunk(key, path))

    def get_into(self, key: str, name: str, out: memoryview) -> bool:
        """Read one-tensor uint8 chunk ``key`` (tensor ``name``) into ``out``, verified in
        place; ``False`` on a miss or a fault (logged; the file is deleted), when ``out``
        holds garbage."""
        def read(path: Path) -> tuple[bool, str, int, str | None]:
            return (True, *read_chunk_into(key, path, name, out))

        return bool(self._verified_read(key, read))

    def _verified_read(self, key: str, read: Callable[[Path], tuple[_T, str, int, str | None]]
                       ) -> _T | None:
        """``read(path)`` -> (value, sha256, payload bytes, tenant), counted and accepted;
        ``None`` on a miss or a fault (logged; the file is deleted)."""
        path = self.path_for(key)
        with self._lock:
            entry = self._index.get(key)
        try:
            value, sha, nbytes, tenant = read(path)
        except FileNotFoundError:
            return self._missing(key, entry)
        except _ChunkFault as fault:
            return self._fault(key, entry, str(fault))
        except OSError as exc:
            return self._fault(key, entry, f"I/O error: {exc}")
        self._accept(key, entry, sha, nbytes, tenant)
        return value

    def put(self, key: str, tensors: Tensors, *, tenant: str | None = None,
            owned: bool = False) -> bool:
        """Write the chunk atomically for ``tenant`` (its bytes count against the tenant's
        quota), evicting as the policy says; ``False`` if too large or on faults.

        ``owned=True``: the caller hands over CPU tensors nobody writes while this runs;
        they are written as they are, without the snapshot copy (issue 35: the image
        tier's tensors are already a private copy; on the main thread torch runs such a
        copy on its intra-op pool, several ms of CPU for 340 KB on 2 cores)."""
        copies = owned_tensors(tensors) if owned else snapshot_tensors(tensors)

        def write(tmp: Path, meta: dict[str, str]) -> None:
            _write_file(tmp, safetensors.torch.save(copies, metadata=meta))

        return self._put_file(key, tensors_nbytes(copies), chunk_checksum(copies), tenant,
                              write)

    def put_row(self, key: str, name: str, row: memoryview, *,
                tenant: str | None = None) -> bool:
        """:meth:`put` of one uint8 tensor ``name`` written straight from ``row`` (no copy:
        the caller must not change it until this returns). Not fsynced: a KV row is a cache
        entry, and one torn by a power cut fails its size or checksum check (a miss)."""
        def write(tmp: Path, meta: dict[str, str]) -> None:
            _write_file(tmp, (u8_chunk_header(name, row.nbytes, meta), row), sync=False)

        return self._put_file(key, row.nbytes, u8_checksum(name, row), tenant, write,
                              durable=False)

    def _put_file(self, key: str, nbytes: int, sha: str, tenant: str | None,
                  write: Callable[[Path, dict[str, str]], None], durable: bool = True) -> bool:
        """Write a chunk file with ``write(tmp, metadata)`` and move it into place."""
        path = self.path_for(key)
        tenant = tenant_label(tenant)  # hostile names stay one short ASCII label
        if not self._tenants.fits(nbytes, self.capacity_bytes):
            logger.debug("%s: chunk %s (%d B) exceeds capacity or quota", self.name, key, nbytes)
            return False
        if self._touch_if_unchanged(key, sha, path):
            return True
        meta = {"vlmcache_format": FORMAT_VERSION, "key": key, "sha256": sha}
        if tenant is not None:
            meta[TENANT_META] = tenant
        tmp = _tmp_path(path.parent, key)
        try:
            make_private_dir(path.parent)
            write(tmp, meta)
        except OSError as exc:
            _unlink_quiet(tmp)
            return self._put_failed(key, exc)
        return self._commit(key, tmp, path, nbytes, sha, tenant, durable)

    def delete(self, key: str) -> bool:
        """Drop ``key`` and its file (listeners are not called); ``True`` when it was there."""
        check_key(key)
        with self._lock, self._ledger.locked() as led:
            entry = self._unindex_locked(key)
            removed = self._remove_file_locked(led, key, entry)
        return entry is not None or removed

    def keys(self) -> list[str]:
        """Indexed keys, least recently used first."""
        with self._lock:
            return list(self._index)

    def tenant_occupancy(self) -> list[TenantOccupancy]:
        """Per-tenant entries, bytes and evictions of the chunks this store indexes."""
        with self._lock:
            return self._tenants.snapshot()

    def shared_occupancy(self) -> int | None:
        """Payload bytes under ``root`` by every process's count (``None``: must be recounted)."""
        return self._ledger.peek()

    def stats(self) -> StoreStats:
        """A consistent snapshot of the counters (occupancy: the chunks this store indexes)."""
        with self._lock:
            return StoreStats(
                tier=self.name, hits=self._hits, misses=self._misses, evictions=self._evictions,
                entries=len(self._index), occupancy_bytes=self._occupancy,
                capacity_bytes=self.capacity_bytes, bytes_read=self._bytes_read,
                bytes_written=self._bytes_written, errors=self._errors,
            )

    def close(self) -> None:
        """Write the manifest (and any suppressed write warnings); the store stays usable."""
        self._write_log.flush()
        self._write_manifest()

    # -- get / put helpers -------------------------------------------------------------------

    def _missing(self, key: str, entry: _Entry | None) -> None:
        """A miss; an indexed chunk whose file vanished (another store evicted it) is dropped."""
        with self._lock:
            self._misses += 1
            if entry is None or self._index.get(key) is not entry:
                return None
            self._unindex_locked(key)
        logger.info("%s: chunk %s was removed by another store on this root", self.name, key)
        return None

    def _fault(self, key: str, entry: _Entry | None, reason: str) -> None:
        """Log, count and delete a chunk file that cannot be trusted (unless replaced meanwhile)."""
        logger.warning("%s: chunk %s is unusable (%s); deleting it", self.name, key, reason)
        with self._lock, self._ledger.locked() as led:
            self._misses += 1
            self._errors += 1
            if self._index.get(key) is entry:
                if entry is not None:
                    self._unindex_locked(key)
                self._remove_file_locked(led, key, entry)
        return None

    def _accept(self, key: str, entry: _Entry | None, sha: str, nbytes: int,
                tenant: str | None) -> None:
        """Count a verified read; touch its entry, or adopt a file another store wrote."""
        with self._lock:
            self._hits += 1
            self._bytes_read += nbytes
            current = self._index.get(key)
            if current is not entry:  # deleted, evicted or rewritten meanwhile: leave it be
                return
            if current is not None and current.sha256 == sha:
                current.last_used = self._stamp_locked()
                current.reused = True
                self._index.move_to_end(key)
                return
            self._unindex_locked(key)
            if nbytes <= self.capacity_bytes:  # another store counted it in the ledger already
                self._index_locked(key, _Entry(nbytes, sha, self._stamp_locked(),
                                               tenant=tenant))

    def _touch_if_unchanged(self, key: str, sha: str, path: Path) -> bool:
        """Skip rewriting an indexed chunk with identical content; just mark it used."""
        with self._lock:
            entry = self._index.get(key)
            if entry is None or entry.sha256 != sha or not path.exists():
                return False
            entry.last_used = self._stamp_locked()
            self._index.move_to_end(key)
            return True

    def _commit(self, key: str, tmp: Path, path: Path, nbytes: int, sha: str,
                tenant: str | None, durable: bool = True) -> bool:
        """Move a written temp file into place, count it and evict until the root fits."""
        try:
            with self._lock, self._ledger.locked() as led:
                if led.total is None or self._recount_due:
                    self._recount_locked(led, {})
                prior = _size_or_none(path, key) if os.path.lexists(path) else 0
                os.replace(tmp, path)  # the only call here that can raise OSError
                led.total = (led.total or 0) + nbytes - (prior or 0)
                self._recount_due |= prior is None
                evicted = self._insert_locked(led, key, nbytes, sha, tenant)
                self._bytes_written += nbytes
                self._puts_since_flush += 1
                flush = self._puts_since_flush >= self.manifest_every
                listeners = list(self._listeners)
        except OSError as exc:
            _unlink_quiet(tmp)
            return self._put_failed(key, exc)
        if durable:
            _fsync_dir(path.parent)
        notify_evicted(self.name, listeners, evicted)
        if flush:
            self._write_manifest()
        return True

    def _put_failed(self, key: str, exc: OSError) -> bool:
        self._write_log.event(f"chunk {key}: {exc}")  # a full disk fails every put
        with self._lock:
            self._errors += 1
        return False

    def _insert_locked(self, led: LedgerView, key: str, nbytes: int, sha: str,
                       tenant: str | None) -> list[str]:
        """(Re)index ``key`` (already on disk and counted) as most recently used, evicting."""
        self._unindex_locked(key)
        evicted = self._evict_locked(led, nbytes, tenant)
        self._unindex_locked(key)  # a recount while evicting indexes the new file
        self._index_locked(key, _Entry(nbytes, sha, self._stamp_locked(), tenant=tenant))
        return evicted

    def _index_locked(self, key: str, entry: _Entry) -> None:
        self._index[key] = entry
        self._occupancy += entry.nbytes
        self._tenants.add(entry.tenant, entry.nbytes)

    def _unindex_locked(self, key: str) -> _Entry | None:
        entry = self._index.pop(key, None)
        if entry is not None:
            self._occupancy -= entry.nbytes
            self._tenants.remove(entry.tenant, entry.nbytes)
        return entry

    def _evict_locked(self, led: LedgerView, incoming: int,
                      tenant: str | None = None) -> list[str]:
        """Evict LRU chunks until the root's total and this index (+ ``incoming``) fit.

        With ``protect_reused``, the least recently used chunk never hit is evicted first
        (searched among the ``_REUSE_WINDOW`` oldest, so at most that many stale reused
        chunks can outlive one-off ones).

        When this store's index runs out while the root is still over budget (the rest was
        written by other processes), the directory is recounted and indexed once.
        """
        evicted: list[str] = []
        recounted = False
        while self._over_locked(led, incoming):
            if not self._index:
                if recounted:
                    break
                self._recount_locked(led, {})
                recounted = True
                continue
            key = self._victim_locked(tenant, incoming)
            entry = self._unindex_locked(key)
            assert entry is not None
            self._tenants.evicted(entry.tenant)
            self._evictions += 1
            self._remove_file_locked(led, key, entry)
            evicted.append(key)
        return evicted

    def _victim_locked(self, tenant: str | None, incoming: int) -> str:
        """The least recently used chunk (never-reused first with ``protect_reused``) of the
        tenant furthest above its quota (counting ``incoming`` bytes of ``tenant``), else of
        anyone: a tenant within its quota is never evicted by another's churn."""
        over = self._tenants.most_over_quota(tenant, incoming)
        first, scanned = None, 0
        for key, entry in self._index.items():
            if over is not None and entry.tenant != over:
                continue
            first = first or key
            if not self.protect_reused or not entry.reused:
                return key
            scanned += 1
            if scanned >= _REUSE_WINDOW:
                break
        return first or next(iter(self._index))

    def _over_locked(self, led: LedgerView, incoming: int) -> bool:
        return ((led.total or 0) > self.capacity_bytes
                or self._occupancy + incoming > self.capacity_bytes)

    def _remove_file_locked(self, led: LedgerView, key: str, entry: _Entry | None) -> bool:
        """Unlink chunk ``key`` and subtract the payload its file declares; ``True`` if removed.

        The size comes from the file being removed, not from ``entry``: another process may
        have rewritten the chunk at another size since this store indexed it, and the ledger
        counted that rewrite. Nobody can replace the file meanwhile (every commit holds the
        ledger lock). An unreadable file subtracts ``entry``'s size and schedules a recount.
        """
        path = self._chunks / key[:2] / f"{key}{SUFFIX}"
        size = _size_or_none(path, key)
        removed = _unlink_quiet(path)
        if not removed:
            return False
        if size is None:
            size = entry.nbytes if entry is not None else 0
            self._recount_due = True
        if led.total is not None:
            led.total = max(0, led.total - size)
        return True

    def _stamp_locked(self) -> float:
        """A strictly increasing wall-clock time, so LRU order survives a manifest round trip."""
        self._clock = max(time.time(), self._clock + 1e-6)
        return self._clock

    # -- manifest and recovery ---------------------------------------------------------------

    def _write_manifest(self) -> bool:
        """Atomically replace the manifest with the current index; ``False`` on I/O faults."""
        with self._manifest_lock:
            with self._lock:
                index = dict(self._index)
                self._puts_since_flush = 0
            error = write_manifest(self._manifest_path, index)
            if error is not None:
                logger.warning("%s: could not write the manifest: %s", self.name, error)
                with self._lock:
                    self._errors += 1
                return False
        _fsync_dir(self.root)
        return True

    def _entry_from_file(self, key: str, last_used: float | None) -> _Entry | None:
        """Index entry of a chunk file: bytes and sha256 from the file, never from a manifest."""
        path = self.path_for(key)
        try:
            nbytes, sha, tenant = file_facts(path, key)
            stamp = last_used if last_used is not None else os.lstat(path).st_mtime
        except _ChunkFault as fault:
            logger.warning("%s: chunk %s is unusable (%s); deleting it", self.name, key, fault)
            self._errors += 1
            _unlink_quiet(path)
            return None
        except OSError as exc:
            logger.warning("%s: skipping unreadable chunk %s: %s", self.name, key, exc)
            return None
        return _Entry(nbytes, sha, stamp, tenant=tenant)

    def _recount_locked(self, led: LedgerView, last_used: dict[str, float]) -> None:
        """Rebuild the index and the root's counter from a scan of the chunk files."""
        known = dict(self._index)
        entries: list[tuple[str, _Entry]] = []
        for key in scan_keys(self.root, self._chunks, self.name):
            stamp = last_used.get(key, known[key].last_used if key in known else None)
            entry = self._entry_from_file(key, stamp)
            if entry is not None:
                entries.append((key, entry))
        entries.sort(key=lambda item: item[1].last_used)
        self._index.clear()
        self._occupancy = 0
        self._tenants.clear()
        for key, entry in entries:
            self._index_locked(key, entry)
            self._clock = max(self._clock, entry.last_used)
        led.total = self._occupancy
        self._recount_due = False

    def _open(self) -> None:
        """Index the chunk files (manifest: LRU order only), recount, enforce the budget."""
        last_used = load_last_used(self._manifest_path, self.name)
        with self._lock, self._ledger.locked() as led:
            self._recount_locked(led, last_used)
            dropped = len(last_used.keys() - self._index.keys())
            if dropped:
                logger.info("%s: reconciled: %d chunks on disk, %d manifest entries dropped",
                            self.name, len(self._index), dropped)
            evicted = self._evict_locked(led, 0)
            listeners = list(self._listeners)
        notify_evicted(self.name, listeners, evicted)


def _size_or_none(path: Path, key: str) -> int | None:
    """Payload bytes of the chunk file at ``path`` (0 if absent, ``None`` if unreadable)."""
    try:
        return file_entry(path, key)[0]
    except FileNotFoundError:
        return 0
    except (_ChunkFault, OSError):
        return None
