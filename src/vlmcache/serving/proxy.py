"""``vlmcache proxy``: the same front, as a standalone server before vLLM servers.

    vlmcache proxy MODEL_DIR --upstream http://127.0.0.1:8000 [--upstream URL2] --port 8080

:class:`UpstreamApp` forwards each request to one upstream (round robin, streaming the
answer through); :class:`~vlmcache.serving.asgi.VlmCacheMiddleware` wraps it exactly as it
wraps vLLM's own app, and ``/metrics`` serves the front's Prometheus registry. The
upstreams must run with vlmcache's engine wiring (``vlmcache serve`` or the connectors'
``--kv-transfer-config``) for the KV and encoder tiers; the front's tiers work either way.
"""

from __future__ import annotations

import itertools
import logging
from typing import Any, Sequence

import httpx
from prometheus_client import REGISTRY, make_asgi_app

from vlmcache.serving.asgi import Receive, Scope, Send, VlmCacheMiddleware
from vlmcache.serving.front import CascadeFront

logger = logging.getLogger(__name__)

_HOP_HEADERS = {b"host", b"content-length", b"connection", b"transfer-encoding",
                b"keep-alive", b"upgrade"}


class UpstreamApp:
    """ASGI app that forwards every HTTP request to one of ``upstreams``."""

    def __init__(self, upstreams: Sequence[str], timeout_s: float = 600.0) -> None:
        if not upstreams:
            raise ValueError("at least one upstream URL is needed")
        self.upstreams = [u.rstrip("/") for u in upstreams]
        self._next = itertools.cycle(range(len(self.upstreams)))
        self._client = httpx.AsyncClient(timeout=timeout_s, limits=httpx.Limits(
            max_connections=512, max_keepalive_connections=128))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        body = await _body(receive)
        url = self.upstreams[next(self._next)] + scope["path"]
        if scope.get("query_string"):
            url += "?" + scope["query_string"].decode("latin-1")
        headers = [(k, v) for k, v in scope.get("headers", []) if k.lower() not in _HOP_HEADERS]
        request = self._client.build_request(scope["method"], url, headers=headers,
                                             content=body)
        try:
            resp = await self._client.send(request, stream=True)
        except httpx.HTTPError as exc:
            logger.warning("proxy: upstream %s failed: %s", url, exc)
            await _bad_gateway(send, f"upstream unavailable: {type(exc).__name__}")
            return
        try:
            await send({"type": "http.response.start", "status": resp.status_code,
                        "headers": [(k, v) for k, v in resp.headers.raw
                                    if k.lower() not in _HOP_HEADERS]})
            async for chunk in resp.aiter_raw():
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
            await send({"type": "http.response.body", "body": b"", "more_body": False})
        finally:
            await resp.aclose()

    async def aclose(self) -> None:
        await self._client.aclose()


class MetricsRoute:
    """Serves ``/metrics`` from prometheus-client's registry; the rest goes to ``app``."""

    def __init__(self, app: Any) -> None:
        self.app = app
        self.metrics = make_asgi_app(registry=REGISTRY)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope.get("path", "").rstrip("/") == "/metrics":
            await self.metrics(scope, receive, send)
            return
        await self.app(scope, receive, send)


def build_proxy_app(front: CascadeFront, upstreams: Sequence[str]) -> Any:
    """The proxy's ASGI app: metrics, then the front, then the upstreams."""
    return MetricsRoute(VlmCacheMiddleware(UpstreamApp(upstreams), front=front))


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
