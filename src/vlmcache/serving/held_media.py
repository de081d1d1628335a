"""Media the engine already holds, sent by identity alone.

vLLM's API server keeps each image and video it processed in its multimodal processor
cache (``--mm-processor-cache-gb``, 4 GiB by default), keyed by the item's identifier,
which the front sets: the ``uuid`` of every image and video part it forwards is the
pixels' hash bound to the tenant (:mod:`vlmcache.serving.rewrite`). A part that carries
that uuid and no data (``"image_url": null``, vLLM's documented form for cached media) is
served from that cache: vLLM's server neither fetches, decodes nor processes the media
again. On a follow-up question about a clip it just saw that work is most of what is left
(a second question on a 60-frame clip takes plain vLLM 250-460 ms on an H200, its prefill
28 tokens; in vLLM's server alone on the CPU naming the clip takes 0.57x the time of
sending it, ``results/held-media-cpu.json``), and the server's CPU work per request is
where plain vLLM saturates under load (``results/serve-gpu.json``).

The front cannot see vLLM's cache, so :class:`HeldMedia` keeps its own account: the items
this process forwarded with their data and the engine accepted (an answer with status
2xx), least recently used out within ``held_media_bytes``. That budget sits below vLLM's
cache for the size estimate's error and for other senders (12 bytes per pixel: float32
RGB, what a processor's ``pixel_values`` hold before any resize). Where vLLM does not hold
an item after all (evicted, restarted, its cache off, the request's processor kwargs
changed its key) it refuses the call before any engine work ("Cache miss for image at
index 0 but data is not provided", 400): :class:`EngineCall` forgets those items and sends
the full body, so the answer is the one the full body gets, one refused call later. After
:data:`PAUSE_AFTER` refusals in a row the front sends full bodies for :data:`PAUSE_S`.

Not every vLLM takes every kind by identity alone: 0.26 parses a null image but fails on a
null video with a 500 (an exception inside its server). Mounted in vLLM's server, the
front asks vLLM's parser which kinds it takes (:func:`vlmcache.vllm.compat.null_media_kinds`);
elsewhere (``vlmcache proxy``) an elided call that fails otherwise than with the cache-miss
refusal, and whose full body then passes, stops the elision of its kinds in this process
for :data:`UNSUPPORTED_S` (a transient failure then costs no more than that).
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Callable, Iterator

from vlmcache.serving.openai_req import ParsedRequest
from vlmcache.serving.overlap import App, Message, Receive, Scope, Send
from vlmcache.serving.wire import dump_json

logger = logging.getLogger(__name__)

#: Processed bytes per pixel assumed for an item (float32 RGB ``pixel_values``).
BYTES_PER_PIXEL = 12
#: Refused elided calls in a row after which the front stops eliding for a while.
PAUSE_AFTER = 3
PAUSE_S = 60.0
#: How long a kind the engine failed on (otherwise than by refusing it) goes in full.
UNSUPPORTED_S = 3600.0
_DATA_KEYS = ("image_url", "video_url")
#: The start of vLLM's refusal of an item named without data that it does not hold (400).
REFUSAL = b"Cache miss for "


@dataclass(frozen=True)
class Elided:
    """A forwarded body with the held media's data taken out; ``keys``: their accounts."""

    body: dict[str, Any]
    keys: tuple[str, ...]
    kinds: frozenset[str]  # "image_url" / "video_url": the parts named without data


@dataclass(frozen=True)
class _Item:
    key: str  # the uuid and the request's processor kwargs: vLLM's cache key is both
    kind: str  # "image_url" or "video_url"
    message: int
    part: int
    nbytes: int


class HeldMedia:
    """The media items this front process believes vLLM's processor cache holds (see the
    module's docstring); thread-safe. ``budget_bytes`` 0: never elide."""

    def __init__(self, budget_bytes: int, clock: Callable[[], float] = time.monotonic,
                 kinds: tuple[str, ...] = _DATA_KEYS) -> None:
        """``kinds``: the parts the engine takes by identity alone (see the module's
        docstring)."""
        self.budget_bytes, self._clock = budget_bytes, clock
        self._kinds = frozenset(kinds)
        self._kind_paused_until: dict[str, float] = {}
        self._items: OrderedDict[str, int] = OrderedDict()
        self._bytes = 0
        self._refusals = 0
        self._paused_until = 0.0
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def elide(self, body: dict[str, Any] | None, req: ParsedRequest) -> Elided | None:
        """``body`` with the data of every media part the engine holds replaced by
        ``None`` (its uuid kept), or ``None`` when it holds none of them."""
        if body is None or self.budget_bytes <= 0:
            return None
        with self._lock:
            if self._clock() < self._paused_until:
                return None
            kinds = self._kinds_now()
            held = [item for item in _items(body, req)
                    if item.key in self._items and item.kind in kinds]
            for item in held:
                self._items.move_to_end(item.key)
        if not held:
            return None
        out = {**body, "messages": [dict(m) if isinstance(m, dict) else m
                                    for m in body["messages"]]}
        for item in held:
            msg = out["messages"][item.message]
            msg["content"] = list(msg["content"])
            msg["content"][item.part] = {**msg["content"][item.part], item.kind: None}
        return Elided(out, tuple(item.key for item in held),
                      frozenset(item.kind for item in held))

    def accepted(self, body: dict[str, Any] | None, req: ParsedRequest,
                 elided: Elided | None) -> None:
        """The engine answered ``body`` (sent as ``elided`` when given): every media item
        it carried is now in vLLM's cache."""
        if body is None or self.budget_bytes <= 0:
            return
        with self._lock:
            if elided is not None:  # its held items were touched when it was elided
                self._refusals = 0
            for item in _items(elided.body if elided is not None else body, req):
                self._put(item.key, item.nbytes)

    def refused(self, elided: Elided) -> None:
        """The engine refused an elided body and took the full one: forget its items;
        after :data:`PAUSE_AFTER` in a row, pause eliding (logged once per pause)."""
        with self._lock:
            self._forget(elided.keys)
            self._refusals += 1
            if self._refusals < PAUSE_AFTER:
                return
            self._refusals = 0
            self._paused_until = self._clock() + PAUSE_S
        logger.warning("front: the engine refused %d bodies in a row that named held media "
                       "without data; sending media in full for %.0f s (is vLLM's "
                       "processor cache off, --mm-processor-cache-gb 0?)", PAUSE_AFTER, PAUSE_S)

    def unsupported(self, elided: Elided) -> None:
        """The engine failed on ``elided`` otherwise than by refusing it and took the full
        body: it does not take those kinds by identity alone; stop eliding them for
        :data:`UNSUPPORTED_S`."""
        with self._lock:
            self._forget(elided.keys)
            until = self._clock() + UNSUPPORTED_S
            self._kind_paused_until.update((kind, until) for kind in elided.kinds)
        logger.warning("front: the engine failed on %s parts named by identity alone and "
                       "answered them with their data; sending those in full for %.0f s",
                       " and ".join(sorted(elided.kinds)), UNSUPPORTED_S)

    @property
    def kinds(self) -> frozenset[str]:
        """The kinds of media parts elided now."""
        with self._lock:
            return self._kinds_now()

    def _kinds_now(self) -> frozenset[str]:
        now = self._clock()
        return frozenset(k for k in self._kinds if self._kind_paused_until.get(k, 0.0) <= now)

    def _forget(self, keys: tuple[str, ...]) -> None:
        for key in keys:
            self._bytes -= self._items.pop(key, 0)

    def _put(self, key: str, nbytes: int) -> None:
        if nbytes > self.budget_bytes:
            return
        self._bytes += nbytes - self._items.pop(key, 0)
        self._items[key] = nbytes
        while self._bytes > self.budget_bytes:
            self._bytes -= self._items.popitem(last=False)[1]


def _items(body: dict[str, Any], req: ParsedRequest) -> Iterator[_Item]:
    """The media parts of a forwarded body that carry their data and the identity the
    front set (the parts the request's images and videos were rewritten into)."""
    kwargs = json.dumps(body.get("mm_processor_kwargs"), sort_keys=True, default=str)
    refs = [(r.message, r.part, _pixels(r.image)) for r in req.images]
    refs += [(r.message, r.part, r.pixels) for r in req.videos]
    for message, part, pixels in refs:
        try:
            got = body["messages"][message]["content"][part]
        except (KeyError, IndexError, TypeError):
            continue
        kind = got.get("type") if isinstance(got, dict) else None
        if kind not in _DATA_KEYS or not isinstance(got.get("uuid"), str) \
                or got.get(kind) is None:
            continue
        yield _Item(got["uuid"] + "\0" + kwargs, kind, message, part, pixels * BYTES_PER_PIXEL)


def _pixels(image: Any) -> int:
    size = getattr(image, "size", None)  # PIL: (width, height)
    if isinstance(size, tuple) and len(size) == 2:
        return int(size[0]) * int(size[1])
    shape = getattr(image, "shape", ())
    return int(shape[0]) * int(shape[1]) if len(shape) >= 2 else 0


class EngineCall:
    """One engine call on a forwarded body, as an ASGI app: the body with held media
    elided first, the full body after a refusal (see the module's docstring). It sends the
    body itself (``body`` as JSON: the full one only when it is sent); ``receive`` gives
    the client's messages after its body. ``outcome``: ``"elided"``, ``"resent"`` after a
    refusal, or ``None``; final once the answer starts going out."""

    def __init__(self, app: App, held: HeldMedia, body: dict[str, Any] | None,
                 req: ParsedRequest) -> None:
        self.app, self.held, self.body, self.req = app, held, body, req
        self.outcome: str | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        elided = self.held.elide(self.body, self.req)
        refused = False  # the elided call met vLLM's refusal (not another failure)
        if elided is not None:
            data = dump_json(elided.body)
            gate = _StatusGate(send)
            self.outcome = "elided"
            try:
                await self.app(with_content_length(scope, data), replay_body(data, receive),
                               gate)
            except Exception:  # raised inside vLLM's server (0.26 on a null video)
                if gate.status:
                    raise  # the answer is going out: nothing to redo
                logger.debug("front: the engine raised on held media named without data",
                             exc_info=True)
                gate.status, gate.head = 500, b"(raised)"
            if gate.passed:
                self.held.accepted(self.body, self.req, elided)
                return
            if not gate.status:  # no answer at all: the client left, the call was aborted
                return
            self.outcome, refused = "resent", REFUSAL in gate.head
            logger.debug("front: the engine refused held media named without data (%d %r); "
                         "sending the full body", gate.status, gate.head[:200])
        full = dump_json(self.body)  # a video's data URL: MBs, serialized once
        gate = _StatusGate(send, hold=False)
        await self.app(with_content_length(scope, full), replay_body(full, receive), gate)
        if not gate.passed:
            return  # the request's own error: the items may well be held still
        if elided is not None and refused:  # the engine did not hold them
            self.held.refused(elided)
        elif elided is not None:  # another failure the full body did not meet
            self.held.unsupported(elided)
        self.held.accepted(self.body, self.req, None)


class _StatusGate:
    """A ``send`` that passes an answer with a 2xx status on, and with ``hold`` keeps any
    other (its first bytes in ``head``, for the log) from the client."""

    def __init__(self, send: Send, hold: bool = True) -> None:
        self.send, self.hold = send, hold
        self.status = 0
        self.head = b""

    @property
    def passed(self) -> bool:
        return 200 <= self.status < 300

    async def __call__(self, message: Message) -> None:
        if message["type"] == "http.response.start":
            self.status = int(message.get("status", 0))
        elif self.hold and not self.passed and message["type"] == "http.response.body":
            self.head = (self.head + message.get("body", b""))[:1024]
        if self.passed or not self.hold:
            await self.send(message)


def with_content_length(scope: Scope, data: bytes) -> Scope:
    """``scope`` with the content length of the forwarded body ``data``."""
    headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() != b"content-length"]
    return {**scope, "headers": [*headers, (b"content-length", str(len(data)).encode())]}


def replay_body(data: bytes, receive: Receive) -> Receive:
    """A ``receive`` that yields ``data`` once, then the client's own messages."""
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": data, "more_body": False}
        return await receive()
    return replay
