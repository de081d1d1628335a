"""Disk writes behind the caller: a background thread, bounded by pending bytes.

What a crash can lose: every chunk still queued (at most ``max_pending_bytes``; see
:meth:`WriteBehind.stats`), plus the chunk being written. Such chunks were acknowledged to
the caller as kept in memory, never as durable; after a restart they are misses, never wrong
bytes (a chunk file is renamed into place only once complete).
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from typing import Protocol

from vlmcache.store.base import Tensors, tensors_nbytes
from vlmcache.store.ratelog import RateLimitedWarning

logger = logging.getLogger(__name__)

_STOP = object()


@dataclass(frozen=True)
class WriteBehindStats:
    """Counters of one write-behind queue.

    ``dropped``: chunks never queued (queue full); ``lost``: chunks queued (acknowledged) whose
    disk write then failed; ``pending_*``: what a crash at this moment would lose.
    """

    queued: int
    written: int
    dropped: int
    lost: int
    pending_chunks: int
    pending_bytes: int
    max_pending_bytes: int


class ChunkWriter(Protocol):
    """Where queued chunks go (a ``DiskStore``, or the persistent KV tier's store)."""

    def put(self, key: str, tensors: Tensors, *, tenant: str | None = None) -> bool: ...


class WriteBehind:
    """Writes chunks to a :class:`ChunkWriter` on ``threads`` background threads.

    A chunk that does not fit the pending-bytes budget is not queued: a dropped write is a
    future miss, while blocking would slow the request being served. Drops and failed writes
    are counted (:meth:`stats`) and logged at most once per ``WARN_INTERVAL_S`` (10 s). Callers must
    not modify tensors after submitting them.
    """

    def __init__(self, disk: ChunkWriter, max_pending_bytes: int, threads: int = 1) -> None:
        self._disk = disk
        self._max_pending = max_pending_bytes
        self._pending_bytes = self._pending_chunks = 0
        self._queued = self._written = self.dropped = self.lost = 0
        self._lock = threading.Lock()
        self._drop_log = RateLimitedWarning(logger, "disk write-behind queue full")
        self._lost_log = RateLimitedWarning(logger, "disk write-behind could not write")
        self._queue: "queue.Queue[object]" = queue.Queue()
        self._threads = [threading.Thread(target=self._run, name="vlmcache-disk-writer",
                                          daemon=True) for _ in range(max(1, threads))]
        for thread in self._threads:
            thread.start()

    def submit(self, key: str, tensors: Tensors, tenant: str | None = None) -> bool:
        """Queue a write (charged to ``tenant``); ``False`` if the pending budget is full
        (a dropped write: counted, rate-limited log)."""
        if self.try_submit(key, tensors, tenant):
            return True
        with self._lock:
            self.dropped += 1
            pending = self._pending_bytes
        self._drop_log.event(f"{pending} bytes pending, chunk {key[:16]} not written to disk")
        return False

    def try_submit(self, key: str, tensors: Tensors, tenant: str | None = None) -> bool:
        """Queue a write if the pending budget has room; ``False`` (nothing counted) if not,
        for a caller that then writes the chunk itself."""
        size = tensors_nbytes(tensors)
        with self._lock:
            if self._pending_bytes + size > self._max_pending:
                return False
            self._pending_bytes += size
            self._pending_chunks += 1
            self._queued += 1
        self._queue.put((key, dict(tensors), size, tenant))
        return True

    def stats(self) -> WriteBehindStats:
        """A snapshot of the counters."""
        with self._lock:
            return WriteBehindStats(self._queued, self._written, self.dropped, self.lost,
                                    self._pending_chunks, self._pending_bytes, self._max_pending)

    def flush(self) -> None:
        """Block until every queued chunk has been written (or has failed)."""
        self._queue.join()

    def close(self) -> None:
        """Write what is queued, log suppressed warnings, stop the threads."""
        self.flush()
        self._drop_log.flush()
        self._lost_log.flush()
        for _ in self._threads:
            self._queue.put(_STOP)
        for thread in self._threads:
            thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                self._write(*item)  # type: ignore[misc]
            finally:
                self._queue.task_done()

    def _write(self, key: str, tensors: Tensors, size: int, tenant: str | None) -> None:
        ok = False
        try:
            ok = self._disk.put(key, tensors, tenant=tenant)
        except Exception:  # the writer must outlive any one bad chunk
            logger.debug("disk write-behind failed for %s", key[:16], exc_info=True)
        with self._lock:
            self._pending_bytes -= size
            self._pending_chunks -= 1
            if ok:
                self._written += 1
            else:
                self.lost += 1
        if not ok:
            self._lost_log.event(f"chunk {key[:16]} was acknowledged but not written")
