"""`vlmcache proxy`: the same front before an upstream server over real loopback HTTP."""

from __future__ import annotations

import asyncio
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).parent))
from fakes import FakeEngineApp, chat, image  # noqa: E402

from vlmcache.testing.server import free_port  # noqa: E402
from vlmcache.config import VlmCacheConfig  # noqa: E402
from vlmcache.serving.front import CascadeFront  # noqa: E402
from vlmcache.serving.metrics import FrontMetrics  # noqa: E402
from vlmcache.serving.proxy import build_proxy_app  # noqa: E402


@pytest.fixture
def upstreams():
    servers, engines = [], []
    for _ in range(2):
        engine = FakeEngineApp()
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(engine, host="127.0.0.1", port=port,
                                               log_level="warning", lifespan="off"))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        servers.append((server, thread, f"http://127.0.0.1:{port}"))
        engines.append(engine)
    deadline = time.monotonic() + 10
    while not all(s.started for s, _, _ in servers) and time.monotonic() < deadline:
        time.sleep(0.05)
    yield [url for _, _, url in servers], engines
    for server, thread, _ in servers:
        server.should_exit = True
        thread.join(timeout=5)


def test_proxy_spreads_requests_and_runs_the_front(tmp_path, upstreams):
    urls, engines = upstreams
    (tmp_path / "m").mkdir()
    front = CascadeFront.for_model(str(tmp_path / "m"), VlmCacheConfig(
        store_path=str(tmp_path / "s"), model_revision="t"),
        metrics=FrontMetrics.create(CollectorRegistry()))
    app = build_proxy_app(front, urls)

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as c:
            a = await c.post("/v1/chat/completions", json=chat("Q one?", image(1)))
            b = await c.post("/v1/chat/completions", json=chat("Q two?", image(2),
                                                                stream=True))
            again = await c.post("/v1/chat/completions", json=chat("Q one?", image(1)))
            health = await c.post("/v1/responses", json={"model": "m", "input": "hi"})
            refused = await c.post("/v1/other", json={"x": 1})
            deep = await c.post("/v1/responses", content=b"[" * 100_000)
            metrics = await c.get("/metrics")
            return a, b, again, health, metrics, refused, deep

    a, b, again, health, metrics, refused, deep = asyncio.run(go())
    assert a.status_code == 200 and a.json()["vlmcache"]["statuses"]["response"] == "miss"
    assert b.text.rstrip().endswith("data: [DONE]") and '"vlmcache"' in b.text
    assert again.json()["vlmcache"]["hit_tier"] == "response"
    assert [len(e.bodies) for e in engines] == [2, 1]  # round robin, the hit never left
    assert engines[0].bodies[0]["messages"][0]["content"][0]["uuid"].startswith("vlmc-")
    assert health.status_code == 200 and engines[0].bodies[-1] == {"model": "m", "input": "hi"}
    assert refused.status_code == 404  # default deny (issue 33): never reached an upstream
    assert deep.status_code == 400 and deep.json()["error"]["param"] == "body"
    assert metrics.status_code == 200


def test_proxy_answers_502_when_no_upstream_answers(tmp_path):
    (tmp_path / "m").mkdir()
    front = CascadeFront.for_model(str(tmp_path / "m"), VlmCacheConfig(
        store_path=str(tmp_path / "s"), model_revision="t"), metrics=None)
    app = build_proxy_app(front, [f"http://127.0.0.1:{free_port()}"])

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as c:
            return await c.post("/v1/chat/completions", json=chat("Q?", image(1)))

    r = asyncio.run(go())
    assert r.status_code == 502
