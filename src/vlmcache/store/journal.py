"""An intent journal: chunks acknowledged to a caller and not yet on disk, per process.

A write-behind queue acknowledges a chunk before its file exists; a crash loses what is
queued. So that the loss is *reported* and not only bounded, each process appends ``+key``
to its own journal file when it acknowledges a chunk and ``-key`` once the write is done
(or has failed: a failed write is counted and logged when it happens). The next process to
open the directory finds journals whose owner is gone, reports every ``+`` without its
``-`` at WARNING ("N acknowledged writes were lost in a crash") and removes them.

Cost: one small ``write(2)`` per acknowledged chunk on the caller's thread (into the page
cache: it survives a ``kill -9``), none per landed chunk beyond the writer thread's own;
``fsync`` at most once per :data:`SYNC_INTERVAL_S`, on the writer thread (a power cut may
lose the last second of entries: the chunk files themselves are not fsynced either).

A live owner holds an exclusive ``flock`` on its journal, which the kernel releases when
the process dies however it dies; that is how a reader tells an orphan from a live journal.
Files are created 0600 with ``O_EXCL | O_NOFOLLOW`` in a 0700 directory.
"""

from __future__ import annotations

import collections
import fcntl
import logging
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

logger = logging.getLogger(__name__)

SUFFIX = ".intent"
#: At most one fsync of the journal per this many seconds.
SYNC_INTERVAL_S = 1.0
#: A journal with no write pending is truncated once it is larger than this.
COMPACT_BYTES = 1 << 20
_FLAGS = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class LostWrites:
    """Acknowledged writes a dead process never completed: ``keys`` (each once)."""

    keys: tuple[str, ...] = ()
    journals: tuple[str, ...] = field(default=())

    @property
    def count(self) -> int:
        return len(self.keys)


def unfinished(text: str) -> list[str]:
    """The keys of a journal's text with more ``+`` than ``-`` entries (a torn last line,
    cut by the crash, is ignored)."""
    balance: collections.Counter[str] = collections.Counter()
    for line in text.split("\n")[:-1]:
        if line[:1] == "+":
            balance[line[1:]] += 1
        elif line[:1] == "-":
            balance[line[1:]] -= 1
    return [key for key, n in balance.items() if n > 0]


def recover(directory: Path, what: str = "chunk") -> LostWrites:
    """Read and remove the journals of dead processes in ``directory``; log what they lost
    (WARNING). Journals of live processes (locked) are left alone."""
    keys: dict[str, None] = {}
    names: list[str] = []
    try:
        paths = sorted(directory.glob(f"*{SUFFIX}"))
    except OSError:
        return LostWrites()
    for path in paths:
        text = _claim(path)
        if text is not None:
            names.append(path.name)
            keys.update(dict.fromkeys(unfinished(text)))
    lost = LostWrites(tuple(keys), tuple(names))
    if lost.count:
        logger.warning("vlmcache: %d acknowledged %s writes to %s were lost in a crash "
                       "(journals %s); they are misses now", lost.count, what,
                       directory.parent, ", ".join(names))
    return lost


def orphaned_count(directory: Path) -> int:
    """How many acknowledged writes the journals of dead processes in ``directory`` hold,
    without claiming them (the next :func:`recover` still reports them)."""
    total = 0
    for path in directory.glob(f"*{SUFFIX}") if directory.is_dir() else ():
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            with os.fdopen(os.dup(fd), "r", errors="replace") as f:
                total += len(unfinished(f.read()))
        except OSError:  # live
            pass
        finally:
            os.close(fd)
    return total


def _claim(path: Path) -> str | None:
    """The text of an orphaned journal, which is then removed; ``None`` if it is live."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino != os.stat(path, follow_symlinks=False).st_ino:
            return None  # another reader claimed and removed it first
        with os.fdopen(os.dup(fd), "r", errors="replace") as f:
            text = f.read()
        path.unlink()
        return text
    except OSError:  # locked: its owner lives (or it vanished)
        return None
    finally:
        os.close(fd)


class IntentJournal:
    """This process's journal in ``directory`` (see the module docstring)."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.path = directory / f"{os.getpid()}-{secrets.token_hex(4)}{SUFFIX}"
        self._fd = os.open(self.path, _FLAGS, 0o600)
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # released by the kernel when we die
        self._lock = threading.Lock()
        self._pending: collections.Counter[str] = collections.Counter()
        self._size = 0
        self._synced = time.monotonic()

    def acked(self, key: str) -> None:
        """``key`` was acknowledged and is not on disk yet."""
        self._append("+", key)

    def landed(self, key: str) -> None:
        """``key``'s write is over (written, or failed and reported)."""
        self._append("-", key)
        now = time.monotonic()
        if now - self._synced >= SYNC_INTERVAL_S:
            self._synced = now
            try:
                os.fsync(self._fd)
            except OSError:
                pass

    def close(self) -> None:
        """Remove the journal (every acknowledged write has landed: call after a flush)."""
        with self._lock:
            if self._fd < 0:
                return
            leftover = sum(self._pending.values())
            if leftover == 0:
                self.path.unlink(missing_ok=True)
            os.close(self._fd)
            self._fd = -1

    def _append(self, sign: str, key: str) -> None:
        line = f"{sign}{key}\n".encode("utf-8", "surrogatepass")
        with self._lock:
            if self._fd < 0:
                return
            self._pending[key] += 1 if sign == "+" else -1
            if self._pending[key] <= 0:
                del self._pending[key]
            try:
                if sign == "-" and not self._pending and self._size > COMPACT_BYTES:
                    os.ftruncate(self._fd, 0)  # nothing pending: the history can go
                    self._size = 0
                    return
                self._size += os.write(self._fd, line)
            except OSError:  # a full disk: the journal is best effort, the write is not
                logger.debug("intent journal %s: append failed", self.path, exc_info=True)
