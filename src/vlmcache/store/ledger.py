"""A byte-occupancy counter shared by every process using one store directory.

``disk_budget`` bounds a *directory*, not a process: each :class:`~vlmcache.store.disk.DiskStore`
commits, deletes and evicts chunk files while holding an exclusive ``flock`` on
``<root>/.occupancy`` and keeps the directory's total payload bytes in that same file. A
process killed between a file operation and the counter update leaves the counter off by one
chunk; every store recounts the directory when it opens and whenever its own index runs out of
victims, so a drift never outlives the next open. Without ``fcntl`` (not POSIX) the lock is
per process only, which is logged once.
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger(__name__)

LEDGER_NAME = ".occupancy"
_WIDTH = 32


@dataclass
class LedgerView:
    """The counter while the lock is held; ``total is None`` when it must be recounted."""

    total: int | None


class OccupancyLedger:
    """An exclusive cross-process lock on a store root plus the root's occupancy counter."""

    def __init__(self, root: Path) -> None:
        self.path = Path(root) / LEDGER_NAME
        self._thread_lock = threading.Lock()  # flock is per open file, not per thread
        self._fd = _open_counter(self.path)
        weakref.finalize(self, os.close, self._fd)
        if fcntl is None:  # pragma: no cover - Windows
            logger.warning("no fcntl: disk_budget of %s is enforced per process only", root)

    @contextmanager
    def locked(self) -> Iterator[LedgerView]:
        """Hold the lock; the counter is written back on exit if it changed."""
        with self._thread_lock:
            if fcntl is not None:
                fcntl.flock(self._fd, fcntl.LOCK_EX)
            try:
                view = LedgerView(self._read())
                before = view.total
                yield view
                if view.total != before and view.total is not None:
                    self._write(view.total)
            finally:
                if fcntl is not None:
                    fcntl.flock(self._fd, fcntl.LOCK_UN)

    def peek(self) -> int | None:
        """The counter now (under the lock), or ``None`` when it is unreadable."""
        with self.locked() as view:
            return view.total

    def _read(self) -> int | None:
        try:
            raw = os.pread(self._fd, _WIDTH, 0)
        except OSError as exc:
            logger.warning("cannot read %s: %s", self.path, exc)
            return None
        try:
            value = int(raw.decode("ascii").strip() or "x")
        except ValueError:
            return None  # missing, torn or foreign: the caller recounts the directory
        return value if value >= 0 else None

    def _write(self, total: int) -> None:
        try:
            os.pwrite(self._fd, f"{max(total, 0)}\n".ljust(_WIDTH).encode("ascii"), 0)
        except OSError as exc:  # the next open recounts
            logger.warning("cannot update %s: %s", self.path, exc)


def _open_counter(path: Path) -> int:
    """Open (creating 0600) the counter file; a planted symlink there is removed, not followed."""
    flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        return os.open(path, flags, 0o600)
    except OSError as exc:
        if not os.path.islink(path):
            raise
        logger.warning("removing a symlink planted at %s (%s)", path, exc)
        os.unlink(path)
        return os.open(path, flags | os.O_EXCL, 0o600)
