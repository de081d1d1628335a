"""A checksummed, byte-bounded LRU store of byte strings in Redis, shared by every replica.

Layout under one namespace ``ns`` (``{...}`` is a Redis hash tag: all keys of a namespace
live in one cluster slot, so the Lua scripts below may touch them together):

- ``<prefix>:{<ns>}:v:<key>``: the value, ``MAGIC + sha256(ns, key, payload) + payload``,
  with an expiry (so ``maxmemory-policy volatile-lru`` can only ever evict values);
- ``<prefix>:{<ns>}:lru``: sorted set key -> last use (Redis server time, so replicas'
  clocks do not matter);
- ``<prefix>:{<ns>}:size``: hash key -> bytes, measured by the put script from the value
  itself (never from a client's claim);
- ``<prefix>:{<ns>}:bytes``: the namespace's occupancy.

Puts, gets and deletes are single Lua scripts, so the budget holds across processes and
replicas: a put evicts least recently used values until the namespace fits. A value that
vanished behind our back (expiry, ``maxmemory``) is repaired out of the accounting by the
next get. A value whose checksum fails is deleted and reported as a miss.
"""

from __future__ import annotations

import hashlib
import logging
import re
import threading
import time
from dataclasses import dataclass

from vlmcache.store.redis_link import FAILED, RedisLink
from vlmcache.store.read_meter import ReadCost, ReadMeter

logger = logging.getLogger(__name__)

MAGIC = b"VLC1"
_DIGEST = 32
_KEY_RE = re.compile(r"[0-9a-f]{2,128}")
_NS_RE = re.compile(r"[0-9A-Za-z_.-]{1,64}")

_PUT = """
local member, value = ARGV[1], ARGV[2]
local budget, ttl, vprefix = tonumber(ARGV[3]), tonumber(ARGV[4]), ARGV[5]
local n = string.len(value)
if n > budget then return {0, 0, {}} end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local old = tonumber(redis.call('HGET', KEYS[3], member) or 0)
redis.call('SET', KEYS[1], value, 'PX', ttl)
redis.call('HSET', KEYS[3], member, n)
redis.call('ZADD', KEYS[2], now, member)
local total = redis.call('INCRBY', KEYS[4], n - old)
local evicted = {}
while total > budget do
  local popped = redis.call('ZPOPMIN', KEYS[2])
  if #popped == 0 then break end
  local victim = popped[1]
  if victim == member then
    redis.call('ZADD', KEYS[2], popped[2], member)
    break
  end
  local size = tonumber(redis.call('HGET', KEYS[3], victim) or 0)
  redis.call('HDEL', KEYS[3], victim)
  redis.call('DEL', vprefix .. victim)
  total = redis.call('DECRBY', KEYS[4], size)
  evicted[#evicted + 1] = victim
end
return {1, total, evicted}
"""

# Take ARGV[1] out of the accounting (its value is gone or going).
_FORGET = """
local size = redis.call('HGET', KEYS[3], ARGV[1])
if size then
  redis.call('HDEL', KEYS[3], ARGV[1])
  redis.call('ZREM', KEYS[2], ARGV[1])
  redis.call('DECRBY', KEYS[4], tonumber(size))
end
"""

_GET = """
local v = redis.call('GET', KEYS[1])
if v then
  local t = redis.call('TIME')
  redis.call('ZADD', KEYS[2], 'XX', tonumber(t[1]) * 1000000 + tonumber(t[2]), ARGV[1])
  return {v, redis.call('PTTL', KEYS[1])}
end
""" + _FORGET + "return false\n"

_DELETE = "local existed = redis.call('DEL', KEYS[1])\n" + _FORGET + "return existed\n"


@dataclass(frozen=True)
class BlobStats:
    """This process's view of one namespace: its own counters plus Redis's occupancy
    (``entries``/``occupancy_bytes`` are -1 when Redis could not be asked)."""

    hits: int
    misses: int
    evictions: int
    entries: int
    occupancy_bytes: int
    capacity_bytes: int
    bytes_read: int
    bytes_written: int
    corrupt: int
    dropped_writes: int


class RedisBlobStore:
    """Verified bytes under hex keys in one Redis namespace, bounded by ``budget_bytes``
    (payload plus the 36-byte header of every value), values expiring after ``ttl_s``."""

    def __init__(self, link: RedisLink, namespace: str, budget_bytes: int,
                 ttl_s: float) -> None:
        if not _NS_RE.fullmatch(namespace):
            raise ValueError(f"redis namespace {namespace!r} must match {_NS_RE.pattern}")
        if budget_bytes < 1 or ttl_s <= 0:
            raise ValueError("budget_bytes and ttl_s must be positive")
        self.link = link
        self.namespace = namespace
        self.budget_bytes = budget_bytes
        self.ttl_ms = max(1, int(ttl_s * 1000))
        base = f"{link.settings.prefix}:{{{namespace}}}"
        self._vprefix = f"{base}:v:"
        self._meta = [f"{base}:lru", f"{base}:size", f"{base}:bytes"]
        client = link.client
        self._put = client.register_script(_PUT)  # type: ignore[attr-defined]
        self._get = client.register_script(_GET)  # type: ignore[attr-defined]
        self._delete = client.register_script(_DELETE)  # type: ignore[attr-defined]
        self.meter = ReadMeter()
        self._lock = threading.Lock()
        self._hits = self._misses = self._evictions = 0
        self._read = self._written = self._corrupt = self._dropped = 0

    def value_key(self, key: str) -> str:
        """The Redis key holding ``key``'s value (for tests and operators)."""
        return self._vprefix + check_key(key)

    def get(self, key: str) -> bytes | None:
        """The verified payload, or ``None`` (absent, Redis unavailable, or corrupt)."""
        found = self.get_with_ttl(key)
        return None if found is None else found[0]

    def get_with_ttl(self, key: str) -> tuple[bytes, float] | None:
        """(verified payload, seconds it has left), or ``None`` (see :meth:`get`)."""
        keys = [self.value_key(key), *self._meta]
        start = time.perf_counter()
        out = self.link.call("get", lambda c: self._get(keys=keys, args=[key], client=c))
        elapsed = time.perf_counter() - start
        if out is FAILED or out is None:
            self._count(misses=1)
            return None
        raw, pttl = out[0], int(out[1])
        self.meter.observe(elapsed, len(raw))
        payload = self._verify(key, raw)
        if payload is None:
            self._count(misses=1, corrupt=1)
            self.delete(key)
            return None
        self._count(hits=1, read=len(payload))
        return payload, max(pttl, 0) / 1000.0

    def put(self, key: str, payload: bytes,
            ttl_s: float | None = None) -> tuple[bool, list[str]]:
        """Store ``payload`` (expiring after ``ttl_s``, default the store's); (kept, keys
        evicted to make room). Redis down or refusing: not kept (counted)."""
        value = MAGIC + self._digest(key, payload) + payload
        keys = [self.value_key(key), *self._meta]
        ttl_ms = self.ttl_ms if ttl_s is None else max(1, int(ttl_s * 1000))
        args = [key, value, self.budget_bytes, ttl_ms, self._vprefix]
        out = self.link.call("put", lambda c: self._put(keys=keys, args=args, client=c))
        if out is FAILED or not out or not int(out[0]):
            self._count(dropped=1)
            return False, []
        evicted = [v.decode() if isinstance(v, bytes) else str(v) for v in out[2]]
        self._count(written=len(payload), evictions=len(evicted))
        return True, evicted

    def delete(self, key: str) -> bool:
        """Drop ``key``; ``True`` when it was there (``False`` also when Redis is down)."""
        keys = [self.value_key(key), *self._meta]
        out = self.link.call("delete", lambda c: self._delete(keys=keys, args=[key], client=c))
        return out is not FAILED and bool(out)

    def size_of(self, key: str) -> int | None:
        """Bytes ``key`` holds in Redis (header included), or ``None`` if absent/unknown."""
        check_key(key)
        start = time.perf_counter()
        out = self.link.call("size", lambda c: c.hget(self._meta[1], key))
        if out is FAILED:
            return None
        self.meter.observe(time.perf_counter() - start, 0)
        return None if out is None else int(out)

    def keys(self) -> list[str]:
        """Stored keys, least recently used first (empty when Redis is unavailable)."""
        out = self.link.call("keys", lambda c: c.zrange(self._meta[0], 0, -1))
        return [] if out is FAILED else [k.decode() for k in out]

    def read_cost(self) -> ReadCost:
        """Measured cost of reading from this namespace (see :class:`ReadCost`)."""
        return self.meter.cost()

    def stats(self) -> BlobStats:
        occupancy = self.link.call("stats", lambda c: (c.zcard(self._meta[0]),
                                                        c.get(self._meta[2])))
        entries, used = (-1, -1) if occupancy is FAILED else (
            int(occupancy[0]), int(occupancy[1] or 0))
        with self._lock:
            return BlobStats(self._hits, self._misses, self._evictions, entries, used,
                             self.budget_bytes, self._read, self._written, self._corrupt,
                             self._dropped)

    def _digest(self, key: str, payload: bytes) -> bytes:
        h = hashlib.sha256(f"{self.namespace}\0{key}\0".encode())
        h.update(payload)
        return h.digest()

    def _verify(self, key: str, raw: bytes) -> bytes | None:
        if len(raw) < len(MAGIC) + _DIGEST or not raw.startswith(MAGIC):
            logger.warning("redis %s: value of %s is malformed; dropped", self.namespace, key)
            return None
        start = len(MAGIC) + _DIGEST
        payload = raw[start:]
        if self._digest(key, payload) != raw[len(MAGIC):start]:
            logger.warning("redis %s: checksum mismatch for %s; dropped", self.namespace, key)
            return None
        return payload

    def _count(self, *, hits: int = 0, misses: int = 0, evictions: int = 0, read: int = 0,
               written: int = 0, corrupt: int = 0, dropped: int = 0) -> None:
        with self._lock:
            self._hits += hits
            self._misses += misses
            self._evictions += evictions
            self._read += read
            self._written += written
            self._corrupt += corrupt
            self._dropped += dropped


def check_key(key: object) -> str:
    """``key`` if it is 2..128 lowercase hex digits, else ``ValueError``."""
    if not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        raise ValueError(f"redis key must be 2..128 lowercase hex digits, got {str(key)[:140]!r}")
    return key
