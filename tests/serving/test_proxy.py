"""`vlmcache proxy`: the same front before an upstream server over real loopback HTTP."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).parent))
from fakes import FakeEngineApp, chat, data_url, image, serving  # noqa: E402

from vlmcache.testing.server import free_port  # noqa: E402
from vlmcache.config import VlmCacheConfig  # noqa: E402
from vlmcache.serving.front import CascadeFront  # noqa: E402
from vlmcache.serving.metrics import FrontMetrics  # noqa: E402
from vlmcache.serving.proxy import build_proxy_app  # noqa: E402


@pytest.fixture
def upstreams():
    engines = [FakeEngineApp(), FakeEngineApp()]
    with serving(engines[0]) as first, serving(engines[1]) as second:
        yield [first, second], engines


def test_proxy_spreads_requests_and_runs_the_front(tmp_path, upstreams):
    urls, engines = upstreams
    (tmp_path / "m").mkdir()
    front = CascadeFront.for_model(str(tmp_path / "m"), VlmCacheConfig(
        store_path=str(tmp_path / "s"), model_revision="t"),
        metrics=FrontMetrics.create(CollectorRegistry()))
    app = build_proxy_app(front, urls, routing="round_robin")

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


def _front(tmp_path, **config):
    (tmp_path / "m").mkdir(exist_ok=True)
    return CascadeFront.for_model(str(tmp_path / "m"), VlmCacheConfig(
        store_path=str(tmp_path / "s"), model_revision="t", **config), metrics=None)


def _jpeg(question, im, tenant):
    body = chat(question, tenant=tenant)
    body["messages"][0]["content"].insert(0, {"type": "image_url", "image_url": {
        "url": data_url(im, "JPEG", quality=90)}})
    return body


def test_affinity_sends_a_canonicalized_jpeg_to_the_replica_of_its_original(tmp_path,
                                                                           upstreams):
    urls, engines = upstreams
    # where canonical bodies go: no engine call started before the cascade decides (a
    # dropped one reaches its replica too; test_overlap.py covers those)
    front = _front(tmp_path, enable_image_embedding=True, response_after_canonical=False,
                   miss_overlap_max_inflight=0)
    assert front.config.proxy_routing == "affinity"  # the default
    app = build_proxy_app(front, urls)
    images = []

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as c:
            # Rendezvous scores hash the upstreams' random ports, so which replica an image
            # prefers is random per run: send new images until both replicas hold one
            # (6 at least; 24 fail to spread once in 2**23 runs).
            while len(images) < 6 or (not all(e.bodies for e in engines) and len(images) < 24):
                images.append(image(len(images) + 1, size=64))
                assert (await c.post("/v1/chat/completions",
                                     json=chat("Q?", images[-1], tenant="A"))).status_code == 200
            for im in images:  # re-encoded, another question: canonicalized to the PNG
                r = await c.post("/v1/chat/completions", json=_jpeg("Other?", im, "A"))
                assert r.json()["vlmcache"]["statuses"]["embedding:vision"] == "hit"
            return (await c.get("/vlmcache/routing")).json()

    stats = asyncio.run(go())
    where = {}
    for n, engine in enumerate(engines):
        for b in engine.bodies:
            where.setdefault(b["messages"][0]["content"][0]["uuid"], set()).add(n)
    assert len(where) == len(images)  # one canonical identity per image
    assert all(len(replicas) == 1 for replicas in where.values()), where
    assert all(len(e.bodies) > 0 for e in engines)  # the images spread over both
    assert stats["policy"] == "affinity" and sum(stats["chosen"]) == 2 * len(images)
    assert stats["upstreams"] == 2 and not any(u in str(stats) for u in urls)  # no URLs
    assert stats["fallbacks"] == 0 and stats["inflight"] == [0, 0]


def test_affinity_falls_back_when_the_preferred_upstream_is_down(tmp_path, upstreams):
    REQUESTS = 32
    urls, engines = upstreams
    dead = f"http://127.0.0.1:{free_port()}"
    app = build_proxy_app(_front(tmp_path), [dead, *urls], routing="affinity")

    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://proxy") as c:
            # 32 images: the dead upstream is some key's first choice but with chance
            # (2/3)^32 (rendezvous scores hash the upstreams' URLs, whose ports vary)
            codes = [(await c.post("/v1/chat/completions", json=chat(f"Q{k}?", image(k),
                                                                      tenant="A"))).status_code
                     for k in range(REQUESTS)]
            return codes, (await c.get("/vlmcache/routing")).json()

    codes, stats = asyncio.run(go())
    assert codes == [200] * REQUESTS and sum(len(e.bodies) for e in engines) == REQUESTS
    assert stats["chosen"][0] >= 1 and stats["fallbacks"] >= 1  # tried once, then skipped


def test_the_routing_flag_is_validated(tmp_path, capsys):
    from vlmcache.cli import main

    assert main(["proxy", str(tmp_path), "--upstream", "http://x", "--routing", "random"]) == 2
    err = capsys.readouterr().err
    assert "routing" in err and "affinity, round_robin" in err and "'random'" in err
    with pytest.raises(Exception, match="proxy_routing: must be one of"):
        VlmCacheConfig(proxy_routing="random")
