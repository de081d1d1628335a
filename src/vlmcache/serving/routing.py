"""Which upstream of ``vlmcache proxy`` gets a request: cache affinity or round robin.

The proxy's front (:class:`~vlmcache.serving.asgi.VlmCacheMiddleware`) canonicalizes a
request before :class:`~vlmcache.serving.proxy.UpstreamApp` forwards it: every image and
video part carries the identity vlmcache minted from its *canonical* pixels and the tenant
(``uuid``; a JPEG re-encode or a verified near-duplicate frame gets the original's), a
prompt-layer hit carries the cached request's text, and the tenant becomes vLLM's
``cache_salt``. :func:`routing_key` reads that forwarded body; :class:`Router` sends
equal keys to the same upstream (rendezvous hashing over the healthy upstreams), where
vLLM's prefix and encoder caches already hold that image's KV.

Fallback: an upstream with more than ``factor * least + slack`` requests in flight (``least``:
the least loaded live upstream's count) is passed over for the next one in the key's
rendezvous order (then the least loaded), and an upstream that refused a connection is
skipped for ``down_s`` seconds. The bound is loose on purpose: vLLM batches a few more
requests at little cost, while a prefix-cache miss recomputes the whole image.

Tenancy: the key hashes the tenant's ``cache_salt`` with the tenant-scoped media
identities, so two tenants' equal images get independent upstreams; what one tenant can
observe of another through routing is load alone (the fallback), never which images or
prompts the other sent.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import time
from typing import Any, Callable, Literal, Sequence, get_args

logger = logging.getLogger(__name__)

Policy = Literal["affinity", "round_robin"]
POLICIES: tuple[str, ...] = get_args(Policy)
PREFIX_CHARS = 512  # the prompt prefix a key covers when a request has no media


def check_policy(policy: str) -> Policy:
    """``policy`` if it is one of :data:`POLICIES`; ``ValueError`` naming them otherwise."""
    if policy not in POLICIES:
        raise ValueError(f"routing: must be one of {', '.join(POLICIES)}; got {policy!r}")
    return policy  # type: ignore[return-value]


def routing_key(body: Any) -> str | None:
    """The affinity key of a forwarded OpenAI body (a dict or its JSON bytes), or ``None``
    (no body, not JSON, nothing to route on).

    The key is ``sha256(cache_salt, model, media identities)``; a request without media
    identities uses its first :data:`PREFIX_CHARS` characters of prompt text instead."""
    if isinstance(body, (bytes, bytearray)):
        if not body.lstrip()[:1] == b"{":
            return None
        try:
            body = json.loads(body)
        except ValueError:
            return None
    if not isinstance(body, dict):
        return None
    media = _media_identities(body.get("messages"))
    if media:
        what = "media\0" + "\0".join(media)
    else:
        prefix = _prompt_prefix(body)
        if not prefix:
            return None
        what = "prefix\0" + prefix
    salt = body.get("cache_salt")
    scope = f"{salt if isinstance(salt, str) else ''}\0{body.get('model', '')}\0"
    return hashlib.sha256((scope + what).encode("utf-8", "surrogatepass")).hexdigest()


def _media_identities(messages: object) -> list[str]:
    """The ``uuid`` of every image and video part, in order (the front mints them)."""
    out: list[str] = []
    if not isinstance(messages, list):
        return out
    for msg in messages:
        content = msg.get("content") if isinstance(msg, dict) else None
        if not isinstance(content, list):
            continue
        for part in content:
            if isinstance(part, dict) and isinstance(part.get("uuid"), str):
                out.append(part["uuid"])
    return out


def _prompt_prefix(body: dict[str, Any]) -> str:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt[:PREFIX_CHARS]
    texts: list[str] = []
    messages = body.get("messages")
    for msg in messages if isinstance(messages, list) else ():
        if not isinstance(msg, dict):
            continue
        texts.append(str(msg.get("role", "")))
        content = msg.get("content")
        if isinstance(content, str):
            texts.append(content)
        elif isinstance(content, list):
            texts += [str(p.get("text", "")) for p in content
                      if isinstance(p, dict) and p.get("type") == "text"]
        if sum(map(len, texts)) >= PREFIX_CHARS:
            break
    return "\n".join(texts)[:PREFIX_CHARS]


class Router:
    """Chooses an upstream per request and keeps the in-flight count of each.

    Plain and synchronous (the proxy calls it from its event loop): ``choose`` then
    ``started``/``finished`` around each forwarded request, ``failed`` when an upstream
    refuses a connection.
    """

    def __init__(self, upstreams: Sequence[str], policy: str = "affinity", slack: int = 8,
                 factor: float = 2.0, down_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if not upstreams:
            raise ValueError("at least one upstream URL is needed")
        if slack < 0 or down_s < 0 or factor < 1:
            raise ValueError(f"need slack >= 0, factor >= 1, down_s >= 0; got {slack}, "
                             f"{factor}, {down_s}")
        self.upstreams = list(upstreams)
        self.policy = check_policy(policy)
        self.slack = slack
        self.factor = factor
        self.down_s = down_s
        self.inflight = [0] * len(self.upstreams)
        self.chosen = [0] * len(self.upstreams)
        self.fallbacks = 0
        self._down_until = [0.0] * len(self.upstreams)
        self._clock = clock
        self._cycle = itertools.cycle(range(len(self.upstreams)))

    def choose(self, key: str | None, exclude: Sequence[int] = ()) -> int:
        """The upstream index for a request with affinity ``key`` (``None``: no key), not
        one of ``exclude`` (those that already failed it) unless nothing else is left."""
        if self.policy == "round_robin":
            index = next(self._cycle)
        else:
            index = self._affinity(key, exclude)
        self.chosen[index] += 1
        return index

    def _affinity(self, key: str | None, exclude: Sequence[int]) -> int:
        now = self._clock()
        live = [i for i in range(len(self.upstreams))
                if i not in exclude and self._down_until[i] <= now]
        if not live:  # every upstream down: try the ones not tried yet, then any
            live = [i for i in range(len(self.upstreams)) if i not in exclude] \
                or list(range(len(self.upstreams)))
        least = min(self.inflight[i] for i in live)
        if key is None:
            return min(live, key=lambda i: (self.inflight[i], i))
        ranked = sorted(live, key=lambda i: self._score(key, i), reverse=True)
        bound = self.factor * least + self.slack
        for i in ranked:
            if self.inflight[i] <= bound:
                if i != self.preferred(key):
                    self.fallbacks += 1
                return i
        return ranked[0]  # unreachable: the least loaded one always qualifies

    def _score(self, key: str, index: int) -> bytes:
        return hashlib.sha256(f"{key}\0{self.upstreams[index]}".encode()).digest()

    def preferred(self, key: str) -> int:
        """The upstream ``key`` goes to when every upstream is up and idle."""
        return max(range(len(self.upstreams)), key=lambda i: self._score(key, i))

    def started(self, index: int) -> None:
        self.inflight[index] += 1

    def finished(self, index: int) -> None:
        self.inflight[index] = max(self.inflight[index] - 1, 0)

    def failed(self, index: int) -> None:
        """``index`` refused a connection: pass it over for ``down_s`` seconds."""
        self._down_until[index] = self._clock() + self.down_s
        logger.warning("proxy: upstream %s marked down for %.1f s", self.upstreams[index],
                       self.down_s)

    def is_down(self, index: int) -> bool:
        return self._down_until[index] > self._clock()

    def stats(self) -> dict[str, Any]:
        """Requests chosen per upstream (in ``--upstream`` order), in flight now, and the
        affinity fallbacks. The upstreams' count, never their URLs: any client may read
        this, and a URL can carry credentials or internal addresses."""
        return {"policy": self.policy, "upstreams": len(self.upstreams),
                "chosen": list(self.chosen), "inflight": list(self.inflight),
                "fallbacks": self.fallbacks}
