"""The front as ASGI middleware: inside vLLM's OpenAI server, or around the proxy.

Inside vLLM (``vlmcache serve`` does this)::

    VLMCACHE_FRONT_CONFIG=/path/front.json python -m vllm.entrypoints.openai.api_server \\
        --model DIR --middleware vlmcache.serving.asgi.VlmCacheMiddleware ...

``front.json`` is ``{"model": DIR, "config": {<vlmcache config keys>}}``.
``POST /v1/chat/completions`` and ``POST /v1/completions`` go through the cascade; every
other route is what :mod:`vlmcache.routes` says (default deny): bound to the
tenant, renderer-only, a read-only pass, or refused (403; 404 for a route it does not
know). A bad request gets a 400 (413 when too large) naming the field; a response-tier hit
is answered here; everything else is forwarded rewritten, and the answer is captured on its
way back (the report: the body's ``vlmcache`` field, or a last stream chunk, and
``x-vlmcache-*`` headers).
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Awaitable, Callable

import anyio.to_thread

from vlmcache.errors import RequestError, RequestTooLarge
from vlmcache.serving.front import CascadeFront
from vlmcache.serving.held_media import EngineCall, HeldMedia, replay_body, with_content_length
from vlmcache.serving.plan import FrontPlan, error_field, report_body
from vlmcache.serving.openai_req import Endpoint, load_body, request_tenant
from vlmcache.serving.overlap import InFlight, OverlappedCall
from vlmcache.serving.rewrite import bind_tenant
from vlmcache.routes import (RoutePolicy, parse_open_routes, refusal_message,
                                     route_policy)
from vlmcache.serving.sse import DONE, StreamAccumulator, event, stream_events
from vlmcache.serving.wire import dump_json
from vlmcache.vllm.compat import null_media_kinds

logger = logging.getLogger(__name__)

CONFIG_ENV = "VLMCACHE_FRONT_CONFIG"
ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completions"}
Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class BodyTooLarge(RequestTooLarge):
    """The request body is over ``max_request_bytes``."""


class VlmCacheMiddleware:
    """ASGI middleware running :class:`CascadeFront` on OpenAI completion requests.

    ``front`` is built from ``$VLMCACHE_FRONT_CONFIG`` when not given (vLLM constructs the
    middleware with the app only).
    """

    def __init__(self, app: Callable[..., Awaitable[None]],
                 front: CascadeFront | None = None, one_engine: bool = True) -> None:
        """``one_engine``: every call reaches the same engine (not a proxy spreading calls
        over replicas without affinity): only then can media go by identity alone."""
        self.app = app
        self.front = front if front is not None else front_from_env()
        self.open_routes = parse_open_routes(self.front.config.open_routes)
        self.in_flight = InFlight(self.front.config.miss_overlap_max_inflight)
        config = self.front.config  # a client's own uuids name data we cannot vouch for
        budget = config.held_media_bytes if one_engine \
            and config.client_image_uuids != "trust" else 0
        # mounted in vLLM's server (no front given): its parser says which media it takes
        # by identity alone; in front of another process the answers say it
        self.held = HeldMedia(budget, kinds=null_media_kinds()) if front is None \
            else HeldMedia(budget)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):  # lifespan
            await self.app(scope, receive, send)
            return
        method = scope.get("method", "GET") if scope["type"] == "http" else "WEBSOCKET"
        path = _route_path(scope)
        policy = route_policy(method, path, self.open_routes)
        if policy.kind == "passes":
            await self.app(scope, receive, send)
        elif policy.kind == "refused":
            await self._refuse(scope, receive, send, method, path, policy)
        elif policy.kind == "front":
            await self._cascade(ROUTES[path], scope, receive, send)
        else:
            await self._guard(scope, receive, send, policy)

    async def _cascade(self, endpoint: Endpoint, scope: Scope, receive: Receive,
                       send: Send) -> None:
        try:
            raw = await _read_body(receive, self.front.config.max_request_bytes)
            held = self.in_flight.take()  # taken now: a burst of misses overlaps only so far
            try:
                plan = await anyio.to_thread.run_sync(self.front.prepare, endpoint, raw,
                                                      _headers(scope), held)
                if plan.miss_forward is not None:
                    try:
                        await self._overlapped(plan, scope, receive, send)
                    finally:
                        self.front.settle(plan)
                    return
            finally:
                if held:
                    self.in_flight.release()
            if plan.cached is None:
                await anyio.to_thread.run_sync(self.front.resolve, plan)
        except RequestError as exc:
            await self._bad_request(send, exc)
            return
        try:
            await self._answer(plan, scope, receive, send)
        finally:
            self.front.settle(plan)

    async def _answer(self, plan: FrontPlan, scope: Scope, receive: Receive,
                      send: Send) -> None:
        """A resolved request: the stored answer, or the engine's on the rewritten body."""
        if plan.cached is not None:
            await self._send_cached(plan, send)
            return
        engine = EngineCall(self.app, self.held, plan.forward, plan.request)
        with self.in_flight:
            await engine(scope, receive, _Capture(self.front, plan, send, engine))

    async def _overlapped(self, plan: FrontPlan, scope: Scope, receive: Receive,
                          send: Send) -> None:
        """The engine starts on the miss's body while the cascade looks (see
        :mod:`vlmcache.serving.overlap`); the call is kept, or dropped for the cascade's
        choice. The answer goes out before a dropped call has wound down."""
        engine = EngineCall(self.app, self.held, plan.miss_forward, plan.request)
        call = OverlappedCall(engine, scope, receive)
        async with anyio.create_task_group() as tg:  # in flight: the caller's slot
            tg.start_soon(call.run)
            try:
                await anyio.to_thread.run_sync(self.front.resolve, plan)
            except RequestError as exc:
                call.drop()
                await self._bad_request(send, exc)
                return
            except BaseException:
                call.drop()
                raise
            if self.front.keep_overlap(plan):
                call.keep(_Capture(self.front, plan, send, engine))
                return
            call.drop()
            await self._answer(plan, scope, receive, send)

    async def _bad_request(self, send: Send, exc: RequestError) -> None:
        self.front.refused(exc)
        await _send_error(send, 413 if isinstance(exc, RequestTooLarge) else 400, exc)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send, method: str,
                      path: str, policy: RoutePolicy) -> None:
        """Default deny: a 403 naming the route (404 unknown, 405 a method it does not serve);
        a websocket is closed before it opens (the server answers 403)."""
        error = RequestError(refusal_message(method, path, policy))
        self.front.refused(error)
        logger.info("front: refused %s %s (%s)", method, path, policy.why)
        if scope["type"] == "websocket":
            await receive()  # websocket.connect
            await send({"type": "websocket.close", "code": 1008})
            return
        status = 404 if not policy.methods else 405 if method not in policy.methods else 403
        await _send_error(send, status, error)

    async def _guard(self, scope: Scope, receive: Receive, send: Send,
                     policy: RoutePolicy) -> None:
        """A bound or renderer-only route: no client-chosen media identity or embedding
        input, and the client's ``cache_salt`` never reaches vLLM (a bound route gets the
        tenant's own, as the cascade's routes do)."""
        config = self.front.config
        try:
            raw = await _read_body(receive, config.max_request_bytes)
            body = load_body(raw)
            key = _identity_key(body)
            if key == "uuid" and config.client_image_uuids == "trust":
                key = None
            if key is not None and key != "uuid" and config.allow_embeds:
                key = None
            if key is not None:
                raise RequestError(f"{key}: client-chosen media identities and embedding "
                                   "inputs are not accepted on this route")
            tenant = request_tenant(body, _headers(scope))
        except RequestError as exc:
            await self._bad_request(send, exc)
            return
        bound = bind_tenant(body, tenant if policy.kind == "bound" else None, config)
        await self._forward(bound, scope, receive, send)

    async def _send_cached(self, plan: FrontPlan, send: Send) -> None:
        body = self.front.cached_response(plan)
        report = body["vlmcache"]
        if not plan.request.stream:
            await _send_json(send, 200, body, _report_headers(report))
            return
        opts = plan.request.body.get("stream_options") or {}
        chunks = list(stream_events(plan.request.endpoint, body,
                                    bool(opts.get("include_usage")),
                                    bool(opts.get("continuous_usage_stats"))))
        chunks += [_report_event(plan, body, report), DONE]
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"text/event-stream; charset=utf-8"),
            *_report_headers(report)]})
        await send({"type": "http.response.body", "body": b"".join(chunks)})

    async def _forward(self, body: dict[str, Any] | None, scope: Scope, receive: Receive,
                       send: Send) -> None:
        data = dump_json(body)
        await self.app(with_content_length(scope, data), replay_body(data, receive), send)


class _Capture:
    """The ``send`` handed to the engine's app: captures its answer, adds the report."""

    def __init__(self, front: CascadeFront, plan: FrontPlan, send: Send,
                 engine: EngineCall | None = None) -> None:
        self.front, self.plan, self.send, self.engine = front, plan, send, engine
        self.start: dict[str, Any] | None = None
        self.stream: StreamAccumulator | None = None
        self.parts: list[bytes] = []

    async def __call__(self, message: dict[str, Any]) -> None:
        if message["type"] == "http.response.start":
            self.start = message
            if self.engine is not None:  # the call that answers: how its media went
                self.plan.held_media = self.engine.outcome
            ctype = dict(message.get("headers", [])).get(b"content-type", b"")
            if ctype.startswith(b"text/event-stream"):
                self.stream = StreamAccumulator(self.plan.request.endpoint)
                await self.send({**message, "headers": [
                    *message.get("headers", []), *_plan_headers(self.plan)]})
            return
        if message["type"] != "http.response.body" or self.start is None:
            await self.send(message)
            return
        if self.stream is not None:
            await self._stream_body(message)
        else:
            await self._json_body(message)

    async def _stream_body(self, message: dict[str, Any]) -> None:
        assert self.stream is not None
        chunk = message.get("body", b"")
        self.stream.feed(chunk)
        more = message.get("more_body", False)
        if DONE in chunk:  # hold [DONE] back: the report goes before it
            chunk = chunk.replace(DONE, b"")
            body = self.stream.response()
            report = await anyio.to_thread.run_sync(self.front.finish, self.plan, 200, body)
            if report is not None and body is not None:
                chunk += _report_event(self.plan, body, report_body(self.plan, report))
            chunk += DONE
        await self.send({"type": "http.response.body", "body": chunk, "more_body": more})

    async def _json_body(self, message: dict[str, Any]) -> None:
        assert self.start is not None
        self.parts.append(message.get("body", b""))
        if message.get("more_body", False):
            return
        raw, status = b"".join(self.parts), self.start["status"]
        headers = [(k, v) for k, v in self.start.get("headers", [])
                   if k.lower() != b"content-length"]
        body = _json_or_none(raw) if status == 200 else None
        report = await anyio.to_thread.run_sync(self.front.finish, self.plan, status, body)
        if report is not None and body is not None:
            body["vlmcache"] = report_body(self.plan, report)
            raw = json.dumps(body).encode()
            headers += _report_headers(body["vlmcache"])
        headers.append((b"content-length", str(len(raw)).encode()))
        await self.send({**self.start, "headers": headers})
        await self.send({"type": "http.response.body", "body": raw, "more_body": False})


def front_from_env() -> CascadeFront:
    """The front described by ``$VLMCACHE_FRONT_CONFIG`` (``vlmcache serve`` writes it)."""
    from vlmcache.config import VlmCacheConfig
    from vlmcache.errors import ConfigError
    from vlmcache.serving.metrics import FrontMetrics
    from vlmcache.vllm.logs import attach_to_vllm_logging

    attach_to_vllm_logging()
    path = os.environ.get(CONFIG_ENV)
    if not path:
        raise ConfigError(f"{CONFIG_ENV} is not set: start the server with `vlmcache serve`, "
                          "or point it to a JSON file {\"model\": DIR, \"config\": {...}}")
    try:
        spec = json.loads(open(path, encoding="utf-8").read())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{CONFIG_ENV}: cannot read {path}: {exc}") from exc
    if not isinstance(spec, dict) or not isinstance(spec.get("model"), str):
        raise ConfigError(f"{CONFIG_ENV}: {path} must hold {{\"model\": ..., \"config\": ...}}")
    config = VlmCacheConfig.from_dict(spec.get("config") or {})
    media_io = spec.get("media_io_kwargs")
    if media_io is not None and not isinstance(media_io, dict):
        raise ConfigError(f"{CONFIG_ENV}: media_io_kwargs in {path} must be an object")
    metrics = FrontMetrics.create(tenant_label=config.metrics_tenant_label)
    front = CascadeFront.for_model(spec["model"], config, metrics=metrics,
                                   media_io_kwargs=media_io)
    # vLLM's server decodes requests' videos in this process: one decode serves both
    from vlmcache.vllm.video_handoff import install

    install(config.video_handoff_budget, config.video_handoff_ttl_s,
            observe=lambda outcome: metrics.video_handoff.labels(outcome).inc())
    return front


async def _read_body(receive: Receive, limit: int) -> bytes:
    parts, size = [], 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise RequestError("body: client disconnected")
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            raise BodyTooLarge(f"body: larger than the {limit}-byte limit")
        parts.append(chunk)
        if not message.get("more_body", False):
            return b"".join(parts)


def _route_path(scope: Scope) -> str:
    """The path the app's router matches (without the ``root_path`` it is mounted under)."""
    path, root = scope.get("path", ""), scope.get("root_path", "")
    if root and path.startswith(root) and path[len(root):len(root) + 1] in ("/", ""):
        return path[len(root):]
    return path


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1")
            for k, v in scope.get("headers", [])}


_IDENTITY_KEYS = ("uuid", "multi_modal_uuids", "image_embeds", "prompt_embeds",
                  "audio_embeds", "video_embeds")


def _identity_key(value: object) -> str | None:
    """The first client identity / embedding key anywhere in a JSON value (iterative: the
    body's depth is bounded by :func:`load_body`, the walk needs no recursion either)."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for k, v in item.items():
                if k in _IDENTITY_KEYS and v is not None:
                    return k
            stack.extend(reversed(list(item.values())))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    return None


def _json_or_none(raw: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _report_headers(report: dict[str, Any]) -> list[tuple[bytes, bytes]]:
    statuses = json.dumps(report.get("statuses", {}), separators=(",", ":"))
    return [(b"x-vlmcache-hit-tier", str(report.get("hit_tier") or "miss").encode()),
            (b"x-vlmcache-statuses", statuses.encode("ascii", "replace"))]


def _plan_headers(plan: FrontPlan) -> list[tuple[bytes, bytes]]:
    """Headers of a streamed answer: what the front decided before the engine ran."""
    res = plan.resolution
    statuses = {"response": plan.response_status, **(res.statuses if res else {})}
    return _report_headers({"hit_tier": res.hit_tier if res else None, "statuses": statuses})


def _report_event(plan: FrontPlan, body: dict[str, Any], report: dict[str, Any]) -> bytes:
    obj = "chat.completion.chunk" if plan.request.endpoint == "chat" else "text_completion"
    return event({"id": body.get("id"), "object": obj, "created": body.get("created"),
                  "model": body.get("model"), "choices": [], "vlmcache": report})


async def _send_json(send: Send, status: int, body: dict[str, Any],
                     headers: list[tuple[bytes, bytes]] = ()) -> None:
    raw = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(raw)).encode()),
        *headers]})
    await send({"type": "http.response.body", "body": raw})


async def _send_error(send: Send, status: int, exc: RequestError) -> None:
    kind = {400: "BadRequestError", 413: "RequestTooLargeError", 403: "RouteRefusedError",
            404: "RouteNotServedError", 405: "MethodNotAllowedError"}[status]
    await _send_json(send, status, {"error": {"message": str(exc), "type": kind,
                                              "param": error_field(exc), "code": status}})
