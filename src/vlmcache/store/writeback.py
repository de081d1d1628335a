"""Disk writes behind the caller: a background thread, bounded by pending bytes."""

from __future__ import annotations

import logging
import queue
import threading
from typing import TYPE_CHECKING

from vlmcache.store.base import Tensors, tensors_nbytes

if TYPE_CHECKING:
    from vlmcache.store.disk import DiskStore

logger = logging.getLogger(__name__)

_STOP = object()


class WriteBehind:
    """Writes chunks to a :class:`DiskStore` on a background thread.

    A chunk that does not fit the pending-bytes budget is not queued (logged): a dropped
    write is a future miss, while blocking would slow the request being served. Callers must
    not modify tensors after submitting them.
    """

    def __init__(self, disk: "DiskStore", max_pending_bytes: int) -> None:
        self._disk = disk
        self._max_pending = max_pending_bytes
        self._pending_bytes = 0
        self.dropped = 0
        self._lock = threading.Lock()
        self._queue: "queue.Queue[object]" = queue.Queue()
        self._thread = threading.Thread(target=self._run, name="vlmcache-disk-writer",
                                        daemon=True)
        self._thread.start()

    def submit(self, key: str, tensors: Tensors) -> bool:
        """Queue a write; ``False`` if the pending budget is full."""
        size = tensors_nbytes(tensors)
        with self._lock:
            if self._pending_bytes + size > self._max_pending:
                self.dropped += 1
                logger.warning("disk write-behind queue full (%d bytes pending): chunk %s "
                               "is not written to disk", self._pending_bytes, key[:16])
                return False
            self._pending_bytes += size
        self._queue.put((key, dict(tensors), size))
        return True

    def flush(self) -> None:
        """Block until every queued chunk has been written (or has failed)."""
        self._queue.join()

    def close(self) -> None:
        self.flush()
        self._queue.put(_STOP)
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is _STOP:
                    return
                key, tensors, size = item  # type: ignore[misc]
                try:
                    self._disk.put(key, tensors)
                finally:
                    with self._lock:
                        self._pending_bytes -= size
            except Exception:  # the writer must outlive any one bad chunk
                logger.exception("disk write-behind failed")
            finally:
                self._queue.task_done()
