"""Disk writes behind the caller: a background thread, bounded by pending bytes.

What a crash can lose: every chunk still queued (at most ``max_pending_bytes``; see
:meth:`WriteBehind.stats`), the chunks being written included. Such chunks were acknowledged
to the caller as kept in memory, never as durable; after a restart they are misses, never
wrong bytes (a chunk file is renamed into place only once complete). With ``journal_dir``
each queued chunk is recorded in an intent journal (:mod:`vlmcache.store.journal`) until its
write is over, and the next writer on that directory reports what a crash lost.
"""

from __future__ import annotations

import logging
import queue
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from vlmcache.store.base import Tensors, tensors_nbytes
from vlmcache.store.journal import IntentJournal, LostWrites, recover
from vlmcache.store.ratelog import RateLimitedWarning

logger = logging.getLogger(__name__)

_STOP = object()


@dataclass(frozen=True)
class WriteBehindStats:
    """Counters of one write-behind queue.

    ``dropped``: chunks never queued (queue full); ``lost``: chunks queued (acknowledged) whose
    disk write then failed; ``pending_*``: what a crash at this moment would lose;
    ``lost_in_crash``: acknowledged chunks a crashed writer on the same journal directory
    never wrote (found when this one opened).
    """

    queued: int
    written: int
    dropped: int
    lost: int
    pending_chunks: int
    pending_bytes: int
    max_pending_bytes: int
    lost_in_crash: int = 0


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

    def __init__(self, disk: ChunkWriter, max_pending_bytes: int, threads: int = 1,
                 journal_dir: Path | None = None) -> None:
        self._disk = disk
        self.crash_loss, self._journal = _open_journal(journal_dir)
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
        if self._journal is not None:
            self._journal.acked(key)  # before the writer can report it landed
        self._queue.put((key, dict(tensors), size, tenant))
        return True

    def stats(self) -> WriteBehindStats:
        """A snapshot of the counters."""
        with self._lock:
            return WriteBehindStats(self._queued, self._written, self.dropped, self.lost,
                                    self._pending_chunks, self._pending_bytes, self._max_pending,
                                    self.crash_loss.count)

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
        if self._journal is not None:
            self._journal.close()  # everything landed: the journal goes

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
        if self._journal is not None:
            self._journal.landed(key)  # a failed write is reported here, not after a crash
        if not ok:
            self._lost_log.event(f"chunk {key[:16]} was acknowledged but not written")


def _open_journal(directory: Path | None) -> tuple[LostWrites, IntentJournal | None]:
    """What crashed writers on ``directory`` lost (reported), and this writer's journal
    (``None`` without a directory, or if it cannot be created: a fault is not a crash)."""
    if directory is None:
        return LostWrites(), None
    lost = recover(directory)
    try:
        return lost, IntentJournal(directory)
    except OSError as exc:
        logger.warning("vlmcache: no intent journal in %s (%s): a crash's losses will not "
                       "be reported", directory, exc)
        return lost, None
