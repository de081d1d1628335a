"""A bounded, checksummed log of records on a Redis stream, which every replica tails.

One stream per namespace: ``<prefix>:{<ns>}:log``, trimmed to about ``max_entries``
(``XADD MAXLEN ~``). Each entry holds the record kind, the publishing replica's id, a JSON
body and a checksum over namespace, kind and body. A reader keeps a cursor (the last
entry id it read) and reads forward in batches; it skips its own entries and any entry
whose checksum fails (counted, logged). Entries trimmed before a slow reader got to them,
or lost with a Redis restart, are simply never learned: sharing is best effort, local
tiers stay authoritative for what this replica computed.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import uuid
from dataclasses import dataclass

from vlmcache.store.redis_link import FAILED, RedisLink

logger = logging.getLogger(__name__)

_NS_RE = re.compile(r"[0-9A-Za-z_.-]{1,64}")
_KIND_RE = re.compile(r"[a-z_]{1,32}")
READ_BATCH = 256


@dataclass(frozen=True)
class LogEntry:
    """One record read from the log."""

    entry_id: str
    kind: str
    origin: str
    body: str


@dataclass(frozen=True)
class LogStats:
    published: int
    publish_failed: int
    read: int
    skipped_own: int
    rejected: int


class RecordLog:
    """Publish to and tail one namespace's shared record stream.

    Args:
        link: the guarded Redis connection.
        namespace: e.g. the namespace digest's first 32 hex digits (binds records to model,
            weights, processor and salt).
        max_entries: approximate length bound of the stream.
        origin: this replica's id (random by default).
    """

    def __init__(self, link: RedisLink, namespace: str, max_entries: int,
                 origin: str | None = None) -> None:
        if not _NS_RE.fullmatch(namespace):
            raise ValueError(f"record log namespace {namespace!r} must match {_NS_RE.pattern}")
        self.link = link
        self.namespace = namespace
        self.max_entries = max_entries
        self.origin = origin or uuid.uuid4().hex
        self.stream = f"{link.settings.prefix}:{{{namespace}}}:log"
        self._cursor = "0-0"
        self._lock = threading.Lock()
        self._published = self._publish_failed = 0
        self._read = self._own = self._rejected = 0

    @property
    def cursor(self) -> str:
        with self._lock:
            return self._cursor

    def publish(self, kind: str, bodies: list[str]) -> int:
        """Append ``bodies`` of ``kind`` in one round trip; how many were appended."""
        if not _KIND_RE.fullmatch(kind):
            raise ValueError(f"record kind {kind!r} must match {_KIND_RE.pattern}")
        if not bodies:
            return 0

        def send(client: object) -> list[object]:
            pipe = client.pipeline(transaction=False)  # type: ignore[attr-defined]
            for body in bodies:
                fields = {"k": kind, "o": self.origin, "b": body,
                          "s": self._checksum(kind, body)}
                pipe.xadd(self.stream, fields, maxlen=self.max_entries, approximate=True)
            return pipe.execute()

        out = self.link.call("publish", send)
        ok = 0 if out is FAILED else len(out)
        with self._lock:
            self._published += ok
            self._publish_failed += len(bodies) - ok
        return ok

    def read(self, count: int = READ_BATCH) -> list[LogEntry]:
        """Entries after the cursor (others' only, verified), advancing the cursor."""
        cursor = self.cursor
        out = self.link.call("read", lambda c: c.xread({self.stream: cursor}, count=count))
        if out is FAILED or not out:
            return []
        entries: list[LogEntry] = []
        last = cursor
        for entry_id, fields in out[0][1]:
            last = entry_id.decode()
            entry = self._parse(last, fields)
            if entry is not None:
                entries.append(entry)
        with self._lock:
            self._cursor = last
            self._read += len(entries)
        return entries

    def stats(self) -> LogStats:
        with self._lock:
            return LogStats(self._published, self._publish_failed, self._read, self._own,
                            self._rejected)

    def _parse(self, entry_id: str, fields: dict[bytes, bytes]) -> LogEntry | None:
        try:
            kind, origin = fields[b"k"].decode(), fields[b"o"].decode()
            body, checksum = fields[b"b"].decode(), fields[b"s"].decode()
        except (KeyError, UnicodeDecodeError):
            return self._reject(entry_id, "malformed entry")
        if origin == self.origin:
            with self._lock:
                self._own += 1
            return None
        if checksum != self._checksum(kind, body):
            return self._reject(entry_id, "checksum mismatch")
        return LogEntry(entry_id, kind, origin, body)

    def _reject(self, entry_id: str, why: str) -> None:
        with self._lock:
            self._rejected += 1
            n = self._rejected
        if n == 1 or n % 1000 == 0:
            logger.warning("shared records %s: skipped entry %s (%s; %d so far)",
                           self.namespace, entry_id, why, n)
        return None

    def _checksum(self, kind: str, body: str) -> str:
        payload = f"{self.namespace}\0{kind}\0{body}".encode()
        return hashlib.sha256(payload).hexdigest()[:32]
