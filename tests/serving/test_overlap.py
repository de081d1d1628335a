"""A miss's engine call starts while the similarity tiers look: kept on a miss, aborted
(and never seen by the client) when the cascade canonicalizes the request."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).parent))
from fakes import FakeEngineApp, chat, data_url, image, serving, sse_events  # noqa: E402

from vlmcache.config import VlmCacheConfig  # noqa: E402
from vlmcache.serving.asgi import VlmCacheMiddleware  # noqa: E402
from vlmcache.serving.front import CascadeFront  # noqa: E402
from vlmcache.serving.metrics import FrontMetrics  # noqa: E402
from vlmcache.serving.proxy import build_proxy_app  # noqa: E402

CHAT = "/v1/chat/completions"


def _front(tmp_path: Path, registry=None, **config) -> CascadeFront:
    (tmp_path / "model").mkdir(exist_ok=True)
    cfg = VlmCacheConfig(store_path=str(tmp_path / "store"), model_revision="test",
                         enable_image_embedding=True, response_after_canonical=False,
                         **config)
    return CascadeFront.for_model(str(tmp_path / "model"), cfg, metrics=None if registry is None
                                  else FrontMetrics.create(registry))


def _jpeg(question: str, im, tenant: str) -> dict:
    body = chat(question, tenant=tenant)
    body["messages"][0]["content"].insert(0, {"type": "image_url", "image_url": {
        "url": data_url(im, "JPEG", quality=90)}})
    return body


def _post_all(app, *bodies, concurrent: bool = False) -> list[httpx.Response]:
    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t",
                                     timeout=30) as c:
            if concurrent:
                return await asyncio.gather(*(c.post(CHAT, json=b) for b in bodies))
            out = []
            for b in bodies:
                out.append(await c.post(CHAT, json=b))
            return out
    return asyncio.run(go())


def _png_then_jpeg(tmp_path: Path, latency_s: float, registry=None):
    """An image asked as a PNG, then the same image re-encoded (the image tier's hit)."""
    front = _front(tmp_path, registry)
    engine = FakeEngineApp(latency_s=latency_s)
    app = VlmCacheMiddleware(engine, front=front)
    im = image(2, size=64)
    first, = _post_all(app, chat("Q?", im, tenant="A"))
    front.drain()
    again, = _post_all(app, _jpeg("Q?", im, "A"))
    return engine, first, again


def _uuid(body: dict) -> str:
    return body["messages"][0]["content"][0]["uuid"]


def test_a_miss_keeps_the_call_started_before_the_cascade_decided(tmp_path):
    registry = CollectorRegistry()
    front = _front(tmp_path, registry)
    engine = FakeEngineApp(latency_s=0.2)
    (r,) = _post_all(VlmCacheMiddleware(engine, front=front), chat("Q?", image(1), tenant="A"))
    report = r.json()["vlmcache"]
    assert r.status_code == 200 and report["miss_overlap"] == "kept"
    assert report["statuses"]["embedding:vision"] == "miss"
    assert len(engine.bodies) == 1 and engine.aborted == []
    assert r.json()["choices"][0]["message"]["content"].startswith("answer:")
    assert "miss_body" in report["front_ms"] and "cascade" in report["front_ms"]
    assert registry.get_sample_value("vlmcache_front_miss_overlaps_total",
                                     {"outcome": "kept"}) == 1


def test_a_canonicalized_request_aborts_the_started_call_and_sends_the_canonical(tmp_path):
    registry = CollectorRegistry()
    engine, first, again = _png_then_jpeg(tmp_path, 1.0, registry)
    report = again.json()["vlmcache"]
    assert report["statuses"]["embedding:vision"] == "hit"
    assert report["miss_overlap"] == "dropped"
    # the engine saw the JPEG's own identity first, aborted it, then ran the canonical
    assert len(engine.aborted) == 1 and _uuid(engine.aborted[0]) != _uuid(engine.bodies[0])
    assert [_uuid(b) for b in engine.bodies] == [_uuid(engine.bodies[0])] * 2
    assert again.json()["choices"] == first.json()["choices"]  # the canonical's answer
    assert registry.get_sample_value("vlmcache_front_miss_overlaps_total",
                                     {"outcome": "dropped"}) == 1


def test_a_dropped_call_that_answers_anyway_never_reaches_the_client(tmp_path):
    """An engine that ignores the disconnect (it answered before the cascade decided):
    its answer is discarded, the client gets the canonical request's only."""
    engine, first, again = _png_then_jpeg(tmp_path, 0.0)
    assert again.json()["vlmcache"]["miss_overlap"] == "dropped"
    assert again.json()["choices"] == first.json()["choices"]
    assert _uuid(engine.bodies[-1]) == _uuid(engine.bodies[0])


def test_a_streamed_miss_holds_the_stream_until_the_cascade_decides(tmp_path):
    front = _front(tmp_path)
    engine = FakeEngineApp(latency_s=0.0)  # the stream is ready before the cascade is
    (r,) = _post_all(VlmCacheMiddleware(engine, front=front),
                     chat("Q?", image(4), tenant="A", stream=True))
    assert r.headers["x-vlmcache-hit-tier"] == "miss"  # decided before the headers went
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    report = json.loads(events[-2])["vlmcache"]
    assert report["miss_overlap"] == "kept" and len(engine.bodies) == 1


@pytest.mark.parametrize("config,extra", [
    ({"miss_overlap_max_inflight": 0}, {}),  # off
    ({"enable_image_embedding": False}, {}),  # nothing to hide: exact tier only
    ({}, {"vlmcache": {"bypass": True}}),  # the cascade does not run
])
def test_no_overlap_without_lookups_to_hide_or_when_off(tmp_path, config, extra):
    (tmp_path / "model").mkdir()
    cfg = VlmCacheConfig(**{"store_path": str(tmp_path / "store"), "model_revision": "test",
                            "enable_image_embedding": True, **config})
    front = CascadeFront.for_model(str(tmp_path / "model"), cfg, metrics=None)
    engine = FakeEngineApp()
    (r,) = _post_all(VlmCacheMiddleware(engine, front=front),
                     chat("Q?", image(5), tenant="A", **extra))
    assert r.status_code == 200 and "miss_overlap" not in r.json()["vlmcache"]
    assert len(engine.bodies) == 1


def test_a_busy_front_sends_a_miss_once_after_the_cascade(tmp_path):
    front = _front(tmp_path, miss_overlap_max_inflight=1)
    engine = FakeEngineApp(latency_s=0.4)
    rs = _post_all(VlmCacheMiddleware(engine, front=front),
                   *(chat("Q?", image(10 + i), tenant="A") for i in range(3)), concurrent=True)
    outcomes = sorted(str(r.json()["vlmcache"].get("miss_overlap")) for r in rs)
    assert outcomes.count("kept") == 1 and outcomes.count("None") == 2, outcomes
    assert len(engine.bodies) == 3 and engine.aborted == []


def test_the_proxy_aborts_the_upstream_call_of_a_dropped_overlap(tmp_path):
    engine = FakeEngineApp(latency_s=1.0)
    front = _front(tmp_path)
    im = image(6, size=64)
    with serving(engine) as url:
        app = build_proxy_app(front, [url])

        async def go():  # one loop: the proxy's upstream client lives on it
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t",
                                         timeout=30) as c:
                first = await c.post(CHAT, json=chat("Q?", im, tenant="A"))
                await asyncio.to_thread(front.drain)
                again = await c.post(CHAT, json=_jpeg("Q?", im, "A"))
                for _ in range(100):  # the upstream sees the disconnect on its own loop
                    if engine.aborted:
                        break
                    await asyncio.sleep(0.05)
                return first, again
        first, again = asyncio.run(go())
    assert again.json()["vlmcache"]["miss_overlap"] == "dropped"
    assert again.json()["choices"] == first.json()["choices"]
    assert len(engine.aborted) == 1 and len(engine.bodies) == 2
    assert _uuid(engine.aborted[0]) != _uuid(engine.bodies[1]) == _uuid(engine.bodies[0])


def test_a_video_request_is_not_overlapped(tmp_path):
    from fakes import clip_bytes, clip_frames, video_chat

    # the paraphrase tier would have lookups to hide for it
    front = _front(tmp_path, enable_semantic_text=True, enable_video_near_duplicates=True)
    engine = FakeEngineApp()
    (r,) = _post_all(VlmCacheMiddleware(engine, front=front),
                     video_chat("Q?", clip_bytes(clip_frames(1)), tenant="A"))
    assert r.status_code == 200 and "miss_overlap" not in r.json()["vlmcache"]
    again, = _post_all(VlmCacheMiddleware(engine, front=front), chat("Q?", image(7), tenant="A"))
    assert again.json()["vlmcache"]["miss_overlap"] == "kept"  # an image request is
