"""``vlmcache proxy``: the same front, as a standalone server before vLLM servers.

    vlmcache proxy MODEL_DIR --upstream http://127.0.0.1:8000 [--upstream URL2] --port 8080 \
        [--routing affinity|round_robin]

:class:`UpstreamApp` forwards each request to one upstream, streaming the answer through;
which one is :class:`~vlmcache.serving.routing.Router`'s choice: by cache affinity on the
canonicalized body (default; with fallback to a less loaded or live upstream) or round
robin. :class:`~vlmcache.serving.asgi.VlmCacheMiddleware` wraps it exactly as it wraps
vLLM's own app, ``/metrics`` serves the front's Prometheus registry and
``/vlmcache/routing`` the router's counts (requests per upstream, in flight, fallbacks). The
upstreams must run with vlmcache's engine wiring (``vlmcache serve`` or the connectors'
``--kv-transfer-config``) for the KV and encoder tiers; the front's tiers work either way.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Sequence

import httpx
import anyio
from prometheus_client import REGISTRY, CollectorRegistry, make_asgi_app

from vlmcache.serving.asgi import Receive, Scope, Send, VlmCacheMiddleware
from vlmcache.serving.front import CascadeFront
from vlmcache.serving.routing import Router, routing_key

logger = logging.getLogger(__name__)

_HOP_HEADERS = {b"host", b"content-length", b"connection", b"transfer-encoding",
                b"keep-alive", b"upgrade"}
_INLINE_PARSE_BYTES = 256 * 1024  # larger bodies are parsed for their key off the loop
_RETRIED = (httpx.ConnectError, httpx.ConnectTimeout)  # the request never reached it
ROUTING_PATH = "/vlmcache/routing"


class UpstreamApp:
    """ASGI app that forwards every HTTP request to one of ``upstreams``, chosen by a
    :class:`Router` (``routing``: ``"affinity"`` or ``"round_robin"``).

    Under affinity, an upstream that refuses the connection is marked down and the request
    goes to the next choice (it never reached the first); round robin keeps its plain
    behaviour (a refused connection is a 502)."""

    def __init__(self, upstreams: Sequence[str], timeout_s: float = 600.0,
                 routing: str = "round_robin", slack: int = 8, factor: float = 2.0,
                 down_s: float = 5.0) -> None:
        if not upstreams:
            raise ValueError("at least one upstream URL is needed")
        self.upstreams = [u.rstrip("/") for u in upstreams]
        self.router = Router(self.upstreams, routing, slack=slack, factor=factor,
                             down_s=down_s)
        self._client = httpx.AsyncClient(timeout=timeout_s, limits=httpx.Limits(
            max_connections=512, max_keepalive_connections=128))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = await _body(receive)
        async with anyio.create_task_group() as tg:
            # a client that leaves ends the upstream call, as vLLM's server aborts its
            # request when its own client leaves (the front drops overlapped calls so)
            tg.start_soon(_cancel_on_disconnect, receive, tg.cancel_scope)
            await self._exchange(scope, body, send)
            tg.cancel_scope.cancel()

    async def _exchange(self, scope: Scope, body: bytes, send: Send) -> None:
        key = await self._key(body)
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in _HOP_HEADERS]
        tried: list[int] = []
        while True:
            index = self.router.choose(key, exclude=tried)
            tried.append(index)
            url = self.upstreams[index] + scope["path"]
            if scope.get("query_string"):
                url += "?" + scope["query_string"].decode("latin-1")
            request = self._client.build_request(scope["method"], url, headers=headers,
                                                 content=body)
            self.router.started(index)
            try:
                resp = await self._client.send(request, stream=True)
            except httpx.HTTPError as exc:
                self.router.finished(index)
                logger.warning("proxy: upstream %s failed: %s", url, exc)
                if self.router.policy == "affinity" and isinstance(exc, _RETRIED):
                    self.router.failed(index)
                    if len(tried) < len(self.upstreams):
                        continue
                await _bad_gateway(send, f"upstream unavailable: {type(exc).__name__}")
                return
            except BaseException:
                self.router.finished(index)
                raise
            break
        try:
            await send({"type": "http.response.start", "status": resp.status_code,
                        "headers": [(k, v) for k, v in resp.headers.raw
                                    if k.lower() not in _HOP_HEADERS]})
            async for chunk in resp.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            self.router.finished(index)
            with anyio.CancelScope(shield=True):  # closes the upstream connection on a cancel
                await resp.aclose()

    async def _key(self, body: bytes) -> str | None:
        """The body's affinity key (round robin needs none)."""
        if self.router.policy != "affinity" or not body:
            return None
        if len(body) <= _INLINE_PARSE_BYTES:
            return routing_key(body)
        return await anyio.to_thread.run_sync(routing_key, body)

    async def aclose(self) -> None:
        await self._client.aclose()


class MetricsRoute:
    """Serves ``/metrics`` from ``registry`` (prometheus-client's default one unless
    given) and ``/vlmcache/routing`` from ``router`` (when given; with ``worker``, the
    slot of the proxy worker whose counts they are); the rest goes to ``app``."""

    def __init__(self, app: Any, router: Router | None = None,
                 registry: CollectorRegistry | None = None, worker: int | None = None) -> None:
        self.app = app
        self.router = router
        self.worker = worker
        self.metrics = make_asgi_app(registry=REGISTRY if registry is None else registry)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "").rstrip("/") if scope["type"] == "http" else ""
        if path == "/metrics":
            await self.metrics(scope, receive, send)
            return
        if path == ROUTING_PATH and self.router is not None:
            stats = self.router.stats()
            if self.worker is not None:
                stats["worker"] = self.worker
            raw = json.dumps(stats).encode()
            await send({"type": "http.response.start", "status": 200,
                        "headers": [(b"content-type", b"application/json")]})
            await send({"type": "http.response.body", "body": raw})
            return
        await self.app(scope, receive, send)


def build_proxy_app(front: CascadeFront, upstreams: Sequence[str],
                    routing: str | None = None,
                    registry: CollectorRegistry | None = None,
                    worker: int | None = None) -> Any:
    """The proxy's ASGI app: metrics, then the front, then the upstreams.

    ``routing``: ``"affinity"`` or ``"round_robin"``; ``None`` takes the config's
    ``proxy_routing``; the fallback bounds are the config's (``proxy_affinity_*``,
    ``proxy_down_s``). ``registry``: what ``/metrics`` serves (default: prometheus-client's
    default registry, where the front's collectors live); ``worker``: this process's slot
    under ``vlmcache proxy --workers`` (shown with the routing counts)."""
    config = front.config
    upstream = UpstreamApp(upstreams, routing=routing or config.proxy_routing,
                           slack=config.proxy_affinity_slack,
                           factor=config.proxy_affinity_factor, down_s=config.proxy_down_s)
    # under affinity a request goes where its media went before (a fallback's refusal
    # costs one resend); round robin over replicas would be refused half the time
    one_engine = len(upstream.upstreams) == 1 or upstream.router.policy == "affinity"
    return MetricsRoute(VlmCacheMiddleware(upstream, front=front, one_engine=one_engine),
                        upstream.router, registry, worker)


async def _body(receive: Receive) -> bytes:
    parts = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            break
        parts.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    return b"".join(parts)


async def _cancel_on_disconnect(receive: Receive, scope: anyio.CancelScope) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    logger.debug("proxy: the client left; its upstream call is cancelled")
    scope.cancel()


async def _lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


async def _bad_gateway(send: Send, message: str) -> None:
    raw = ('{"error": {"message": "%s", "type": "BadGateway", "code": 502}}' % message).encode()
    await send({"type": "http.response.start", "status": 502,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": raw})
