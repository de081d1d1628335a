"""Response tier: a deterministic repeat gets the stored response without the engine.

A request qualifies when its sampling is deterministic (greedy, or seeded) and it asks for
one choice. Its key binds the namespace (model, weights, processor, salt), the tenant and
the canonical request: the body as sent with every image replaced by its pixel-content
identity and with transport-only fields (``stream``, ``stream_options``, vlmcache's own
options) removed. A stored value is JSON with a SHA-256 of its body: a value that does not
verify is a miss, deleted, never served.

Records live behind :class:`RecordStore` (get/put/delete with a TTL; the implementation
owns its byte budget): :class:`LocalRecordStore` keeps them in this process's memory; a
shared implementation (e.g. Redis) plugs in through the same Protocol.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Mapping, Protocol

logger = logging.getLogger(__name__)

RECORD_VERSION = 1
#: Body fields that change how a response is delivered, not what it says.
TRANSPORT_FIELDS = frozenset({"stream", "stream_options", "vlmcache", "user",
                              "request_id", "kv_transfer_params", "ec_transfer_params"})


class RecordStore(Protocol):
    """Bytes under string keys, each with a time to live; the store bounds its own bytes."""

    def get(self, key: str) -> bytes | None:
        """The live value of ``key``, or ``None`` (absent, expired or unreadable)."""

    def put(self, key: str, value: bytes, ttl_s: float) -> bool:
        """Store ``value`` for ``ttl_s`` seconds; ``False`` if it was not kept."""

    def delete(self, key: str) -> None:
        """Forget ``key`` (no error if absent)."""


@dataclass
class _Entry:
    value: bytes
    expires: float


class LocalRecordStore:
    """In-process :class:`RecordStore`: LRU within ``max_bytes``, entries expire by TTL."""

    def __init__(self, max_bytes: int, clock=time.monotonic) -> None:
        self.max_bytes = max_bytes
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()
        self.evictions = 0

    def get(self, key: str) -> bytes | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return None
            if entry.expires <= self._clock():
                self._drop(key)
                return None
            self._entries.move_to_end(key)
            return entry.value

    def put(self, key: str, value: bytes, ttl_s: float) -> bool:
        if len(value) > self.max_bytes or ttl_s <= 0:
            return False
        with self._lock:
            self._drop(key)
            self._entries[key] = _Entry(bytes(value), self._clock() + ttl_s)
            self._bytes += len(value)
            while self._bytes > self.max_bytes:
                oldest = next(iter(self._entries))
                self._drop(oldest)
                self.evictions += 1
        return True

    def delete(self, key: str) -> None:
        with self._lock:
            self._drop(key)

    @property
    def occupancy_bytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)

    def _drop(self, key: str) -> None:
        entry = self._entries.pop(key, None)
        if entry is not None:
            self._bytes -= len(entry.value)


def is_deterministic(body: Mapping[str, object]) -> bool:
    """Whether an OpenAI request body always yields the same response from one engine.

    Greedy (``temperature`` 0) or seeded sampling, one choice. Without an explicit
    ``temperature`` the server's default applies (OpenAI's is 1.0): only a seed makes it
    deterministic then.
    """
    n = body.get("n", 1)
    if n not in (None, 1):
        return False
    temperature = body.get("temperature")
    greedy = isinstance(temperature, (int, float)) and not isinstance(temperature, bool) \
        and temperature == 0
    seeded = isinstance(body.get("seed"), int) and not isinstance(body.get("seed"), bool)
    return greedy or seeded


def canonical_request(endpoint: str, body: Mapping[str, object]) -> str:
    """The request's identity as JSON: sorted keys, transport fields removed.

    The caller has already replaced every image by its content identity.
    """
    kept = {k: v for k, v in body.items() if k not in TRANSPORT_FIELDS}
    return json.dumps([endpoint, kept], sort_keys=True, separators=(",", ":"))


class ResponseTier:
    """Stores and returns whole responses of deterministic requests.

    Args:
        store: where records live (:class:`LocalRecordStore` or a shared one).
        namespace_digest: binds records to model, weights, processor and deployment salt.
        ttl_s: how long a stored response may be served.
        max_entry_bytes: larger responses are not stored.
    """

    def __init__(self, store: RecordStore, namespace_digest: str, ttl_s: float,
                 max_entry_bytes: int) -> None:
        self.store = store
        self.namespace_digest = namespace_digest
        self.ttl_s = ttl_s
        self.max_entry_bytes = max_entry_bytes

    def key(self, canonical: str, tenant: str | None) -> str:
        """Record key of a canonical request for ``tenant`` (``None``: no tenant)."""
        scope = "" if tenant is None else "t:" + tenant
        payload = f"response\0{RECORD_VERSION}\0{self.namespace_digest}\0{scope}\0{canonical}"
        # tenants and texts come from clients: a lone surrogate must not raise
        return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()

    def lookup(self, key: str) -> dict[str, object] | None:
        """The stored response body, or ``None``; a record that fails its check is dropped."""
        try:
            raw = self.store.get(key)
        except Exception as exc:  # a store fault is a miss
            logger.warning("response tier: lookup failed (%s); treated as a miss", exc)
            return None
        if raw is None:
            return None
        body = _decode(raw)
        if body is None:
            logger.warning("response tier: record %s failed its checksum; dropped", key[:12])
            self._delete(key)
        return body

    def record(self, key: str, response: Mapping[str, object]) -> bool:
        """Store ``response`` (a JSON-able body) under ``key``; ``False`` if not kept."""
        raw = _encode(response)
        if len(raw) > self.max_entry_bytes:
            return False
        try:
            return self.store.put(key, raw, self.ttl_s)
        except Exception as exc:
            logger.warning("response tier: store failed (%s); response not kept", exc)
            return False

    def _delete(self, key: str) -> None:
        try:
            self.store.delete(key)
        except Exception as exc:
            logger.warning("response tier: delete failed (%s)", exc)


def _encode(response: Mapping[str, object]) -> bytes:
    body = json.dumps(response, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(body.encode()).hexdigest()
    return json.dumps({"v": RECORD_VERSION, "sha256": digest, "body": body},
                      separators=(",", ":")).encode()


def _decode(raw: bytes) -> dict[str, object] | None:
    try:
        outer = json.loads(raw)
        body = outer["body"]
        if outer.get("v") != RECORD_VERSION or not isinstance(body, str):
            return None
        if hashlib.sha256(body.encode()).hexdigest() != outer.get("sha256"):
            return None
        value = json.loads(body)
    except (ValueError, KeyError, TypeError):
        return None
    return value if isinstance(value, dict) else None
