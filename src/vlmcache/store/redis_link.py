"""A guarded Redis connection: bounded time per call, fail fast while down, reconnect with backoff.

Every Redis call vlmcache makes goes through :meth:`RedisLink.call`. A call either returns
the command's result or :data:`FAILED` within about one socket timeout; it never raises
and never retries on the caller's thread. After a connection error or timeout the link is
*down*: calls fail at once (no socket touched) until a backoff delay (doubling, with
jitter, up to ``backoff_max_s``) has passed, then one call tries again. So a dead or hung
Redis costs a request one timeout per backoff period, never a block.
"""

from __future__ import annotations

import inspect
import logging
import os
import random
import threading
import time
from dataclasses import dataclass
from typing import Callable, TypeVar
from urllib.parse import urlsplit, urlunsplit

from vlmcache.config import VlmCacheConfig
from vlmcache.errors import require

logger = logging.getLogger(__name__)

T = TypeVar("T")
BACKOFF_MIN_S = 0.05
_REFUSED, _NORMAL, _PROBE = 0, 1, 2


class _Failed:
    """The result of a Redis call that did not complete (a miss for reads, a drop for writes)."""

    def __repr__(self) -> str:
        return "FAILED"

    def __bool__(self) -> bool:
        return False


FAILED = _Failed()


@dataclass(frozen=True)
class RedisSettings:
    """How to reach Redis. ``password`` is read from the environment and never shown."""

    url: str
    # defaults come from the one config (a RedisSettings built by hand, e.g. in tests,
    # behaves like a deployment that left these keys unset)
    password_env: str = VlmCacheConfig.redis_password_env
    tls_ca_file: str | None = VlmCacheConfig.redis_tls_ca_file
    prefix: str = VlmCacheConfig.redis_prefix
    timeout_s: float = VlmCacheConfig.redis_timeout_ms / 1000.0
    connect_timeout_s: float = VlmCacheConfig.redis_connect_timeout_ms / 1000.0
    backoff_max_s: float = VlmCacheConfig.redis_backoff_max_s

    @classmethod
    def from_config(cls, config: VlmCacheConfig) -> "RedisSettings":
        """From a :class:`~vlmcache.config.VlmCacheConfig` whose ``redis_url`` is set."""
        if not config.redis_url:
            raise ValueError("redis_url is not set")
        return cls(url=config.redis_url, password_env=config.redis_password_env,
                   tls_ca_file=config.redis_tls_ca_file, prefix=config.redis_prefix,
                   timeout_s=config.redis_timeout_ms / 1000.0,
                   connect_timeout_s=config.redis_connect_timeout_ms / 1000.0,
                   backoff_max_s=config.redis_backoff_max_s)

    @property
    def safe_url(self) -> str:
        """The URL without any user information (what logs show)."""
        return redact_url(self.url)


def redact_url(url: str) -> str:
    """``url`` with user name and password removed."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urlunsplit((parts.scheme, netloc, parts.path, "", ""))
    except ValueError:
        return "<unparseable redis url>"


def make_client(settings: RedisSettings) -> object:
    """A redis-py client with vlmcache's timeouts and no retries (the link decides)."""
    redis = require("redis", "redis")
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    extra: dict[str, object] = {}
    if settings.url.startswith("rediss://") and settings.tls_ca_file:
        extra["ssl_ca_certs"] = settings.tls_ca_file
    params = inspect.signature(redis.Redis.__init__).parameters  # type: ignore[attr-defined]
    # redis-py >= 5 sends CLIENT SETINFO twice on every connect: two more round trips
    if "driver_info" in params:
        extra["driver_info"] = None  # redis-py >= 8: an explicit None turns it off
    elif "lib_name" in params:
        extra.update(lib_name=None, lib_version=None)
    try:  # redis-py >= 7 probes for cluster maintenance notifications: an extra round trip
        from redis.maint_notifications import MaintNotificationsConfig

        extra["maint_notifications_config"] = MaintNotificationsConfig(enabled=False)
    except ImportError:
        pass
    password = os.environ.get(settings.password_env) or None
    return redis.Redis.from_url(
        settings.url, password=password, socket_timeout=settings.timeout_s,
        socket_connect_timeout=settings.connect_timeout_s, retry=Retry(NoBackoff(), 0),
        retry_on_timeout=False, health_check_interval=0, decode_responses=False, **extra)


@dataclass(frozen=True)
class LinkStats:
    """Counters of one link: calls, failures, and how often it went down and came back."""

    calls: int
    failures: int
    skipped_while_down: int
    disconnects: int
    reconnects: int
    rejected: int
    up: bool


class RedisLink:
    """Thread-safe guard around one redis-py client (see the module docstring)."""

    def __init__(self, settings: RedisSettings, client: object | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.client = client if client is not None else make_client(settings)
        self._clock = clock
        self._lock = threading.Lock()
        self._down_until = 0.0
        self._backoff = 0.0
        self._probing = False
        self._calls = self._failures = self._skipped = 0
        self._disconnects = self._reconnects = self._rejections = 0
        redis = require("redis", "redis")
        self._transport_errors: tuple[type[BaseException], ...] = (
            redis.ConnectionError, redis.TimeoutError, OSError)  # type: ignore[attr-defined]

    def __repr__(self) -> str:
        return f"RedisLink({self.settings.safe_url!r})"

    @property
    def up(self) -> bool:
        """Whether the last call succeeded (or none failed yet)."""
        with self._lock:
            return self._backoff == 0.0

    def call(self, what: str, fn: Callable[[object], T]) -> T | _Failed:
        """``fn(client)``'s result, or :data:`FAILED` (logged at most once per outage)."""
        admitted = self._admit()
        if admitted == _REFUSED:
            return FAILED
        try:
            result = fn(self.client)
        except self._transport_errors as exc:  # unreachable, timed out: back off
            self._failed(what, exc, probe=admitted == _PROBE)
            return FAILED
        except Exception as exc:  # a command error (e.g. OOM): this call only fails
            self._rejected(what, exc)
            return FAILED
        self._succeeded()
        return result

    def stats(self) -> LinkStats:
        with self._lock:
            return LinkStats(self._calls, self._failures, self._skipped, self._disconnects,
                             self._reconnects, self._rejections, self._backoff == 0.0)

    def close(self) -> None:
        """Close the client's connections (the link stays usable: it reconnects)."""
        try:
            self.client.close()  # type: ignore[attr-defined]
        except Exception:
            logger.debug("closing the redis client failed", exc_info=True)

    def _admit(self) -> int:
        with self._lock:
            self._calls += 1
            if self._backoff == 0.0:
                return _NORMAL
            if self._probing or self._clock() < self._down_until:
                self._skipped += 1
                return _REFUSED
            self._probing = True  # one caller probes; the others keep failing fast
            return _PROBE

    def _failed(self, what: str, exc: Exception, probe: bool) -> None:
        from_up = False
        with self._lock:
            self._failures += 1
            if self._backoff == 0.0:
                from_up = True
                self._disconnects += 1
                self._backoff = BACKOFF_MIN_S
            elif probe:  # only a failed probe lengthens the pause, not calls already in flight
                self._probing = False
                self._backoff = min(self._backoff * 2, self.settings.backoff_max_s)
            else:
                return
            delay = self._backoff * random.uniform(0.5, 1.0)
            self._down_until = self._clock() + delay
        if from_up:
            logger.warning("redis %s unavailable (%s during %s: %s); lookups miss and writes "
                           "drop until it is back", self.settings.safe_url,
                           type(exc).__name__, what, _short(exc))
        else:
            logger.debug("redis %s still down (%s)", self.settings.safe_url, type(exc).__name__)

    def _rejected(self, what: str, exc: Exception) -> None:
        self._succeeded()  # the server answered: it is reachable
        with self._lock:
            self._failures += 1
            self._rejections += 1
            first = self._rejections == 1 or self._rejections % 1000 == 0
        if first:  # rate-limited: a full Redis rejects every write
            logger.warning("redis %s rejected %s (%s: %s; %d rejection(s) so far)",
                           self.settings.safe_url, what, type(exc).__name__, _short(exc),
                           self._rejections)

    def _succeeded(self) -> None:
        with self._lock:
            self._probing = False
            if self._backoff == 0.0:
                return
            self._backoff = 0.0
            self._reconnects += 1
        logger.warning("redis %s is back", self.settings.safe_url)


def _short(exc: Exception) -> str:
    """An exception message cut short (redis-py messages can repeat the host, never secrets)."""
    return str(exc)[:200]


_links: dict[RedisSettings, RedisLink] = {}
_links_lock = threading.Lock()


def shared_link(settings: RedisSettings) -> RedisLink:
    """The process-wide link for ``settings`` (one connection pool per Redis per process),
    warmed up on first use."""
    with _links_lock:
        link = _links.get(settings)
        if link is None:
            link = RedisLink(settings)
            _links[settings] = link
            threading.Thread(target=warm_up, args=(link,), name="vlmcache-redis-warm-up",
                             daemon=True).start()
        return link


def warm_up(link: RedisLink, attempts: int = 20, pause_s: float = 0.1) -> bool:
    """Open a pooled connection before the first request needs one.

    Off the request path and outside the link's state: a slow first connect (TCP, TLS, AUTH)
    neither takes the link down nor counts as a read latency. ``True`` once Redis answered.
    """
    for _ in range(attempts):
        try:
            link.client.ping()  # type: ignore[attr-defined]
            return True
        except Exception:  # not up yet, or slower than the timeouts: try again
            time.sleep(pause_s)
    logger.info("redis %s did not answer the warm-up; lookups will miss until it does",
                link.settings.safe_url)
    return False
