"""The front as ASGI middleware around a CPU stand-in for vLLM's app (no engine)."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import httpx
import pytest
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).parent))
from fakes import FakeEngineApp, chat, data_url, delta_text, image, sse_events  # noqa: E402

from vlmcache.config import VlmCacheConfig  # noqa: E402
from vlmcache.serving.asgi import VlmCacheMiddleware  # noqa: E402
from vlmcache.serving.front import CascadeFront  # noqa: E402
from vlmcache.serving.metrics import FrontMetrics  # noqa: E402

CHAT = "/v1/chat/completions"


class Rig:
    def __init__(self, tmp_path: Path, **config) -> None:
        model = tmp_path / "model"
        model.mkdir(exist_ok=True)
        cfg = VlmCacheConfig(store_path=str(tmp_path / "store"), model_revision="test",
                             **config)
        self.registry = CollectorRegistry()
        self.front = CascadeFront.for_model(str(model), cfg,
                                            metrics=FrontMetrics.create(self.registry))
        self.engine = FakeEngineApp()
        self.app = VlmCacheMiddleware(self.engine, front=self.front)

    def post(self, body, path: str = CHAT, **kw) -> httpx.Response:
        async def go():
            transport = httpx.ASGITransport(app=self.app)
            async with httpx.AsyncClient(transport=transport, base_url="http://t") as c:
                if isinstance(body, (bytes, str)):
                    return await c.post(path, content=body, **kw)
                return await c.post(path, json=body, **kw)
        response = asyncio.run(go())
        self.front.drain()  # background records made: the next request sees them
        return response

    def metric(self, name: str, **labels) -> float:
        return self.registry.get_sample_value(name, labels) or 0.0


@pytest.fixture
def rig(tmp_path):
    return Rig(tmp_path)


def test_repeat_is_served_by_the_response_tier_without_the_engine(rig):
    first = rig.post(chat("What is shown?", image(1), tenant="A"))
    second = rig.post(chat("What is shown?", image(1), tenant="A"))
    assert first.status_code == second.status_code == 200
    assert len(rig.engine.bodies) == 1
    assert second.headers["x-vlmcache-hit-tier"] == "response"
    a, b = first.json(), second.json()
    assert a["choices"] == b["choices"] and a["id"] != b["id"]
    assert b["vlmcache"]["hit_tier"] == "response"
    assert a["vlmcache"]["statuses"]["response"] == "miss"
    assert rig.metric("vlmcache_tier_lookups_total", tier="response", tenant="A",
                      status="hit") == 1


def test_streamed_repeat_replays_the_stored_answer_as_chunks(rig):
    first = rig.post(chat("What is shown?", image(1), tenant="A")).json()
    streamed = rig.post(chat("What is shown?", image(1), tenant="A", stream=True,
                             stream_options={"include_usage": True}))
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = sse_events(streamed)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = delta_text(chunks)
    assert text == first["choices"][0]["message"]["content"]
    assert any(c.get("usage") for c in chunks)
    assert chunks[-1]["vlmcache"]["hit_tier"] == "response"
    assert len(rig.engine.bodies) == 1


def test_streamed_repeat_with_continuous_usage_marks_the_first_token_like_vllm(rig):
    first = rig.post(chat("What is shown?", image(1), tenant="A")).json()
    streamed = rig.post(chat("What is shown?", image(1), tenant="A", stream=True,
                             stream_options={"include_usage": True,
                                             "continuous_usage_stats": True}))
    chunks = [json.loads(e) for e in sse_events(streamed)[:-1]]
    with_choices = [c for c in chunks if c.get("choices")]
    # the role chunk: no token yet; the content chunk on: the stored answer's count
    assert with_choices[0]["usage"]["completion_tokens"] == 0
    assert with_choices[1]["choices"][0]["delta"]["content"] == \
        first["choices"][0]["message"]["content"]
    assert all(c["usage"] == first["usage"] for c in with_choices[1:])
    assert chunks[-2]["usage"] == first["usage"] and not chunks[-2]["choices"]
    plain = rig.post(chat("What is shown?", image(1), tenant="A", stream=True))
    assert not any("usage" in json.loads(e) for e in sse_events(plain)[:-1])
    opts = {"include_usage": True, "continuous_usage_stats": True}
    rig.post(chat("Describe it.", image(2), tenant="A", stream=True, stream_options=opts))
    assert rig.engine.bodies[-1]["stream_options"] == opts  # a miss: passed to vLLM as sent


def test_streamed_miss_is_captured_and_reported_before_done(rig):
    streamed = rig.post(chat("Describe it.", image(2), stream=True))
    events = sse_events(streamed)
    assert events[-1] == "[DONE]"
    report = json.loads(events[-2])["vlmcache"]
    assert report["statuses"]["response"] == "miss"
    again = rig.post(chat("Describe it.", image(2)))
    assert again.json()["vlmcache"]["hit_tier"] == "response"
    assert len(rig.engine.bodies) == 1


@pytest.mark.parametrize("extra", [{"temperature": 0.7}, {"temperature": 0, "n": 2},
                                   {"vlmcache": {"response_cache": False}}])
def test_response_tier_skips_non_deterministic_or_opted_out_requests(rig, extra):
    for _ in range(2):
        r = rig.post(chat("What is shown?", image(1), **extra))
        assert r.json()["vlmcache"]["statuses"]["response"] == "skip"
    assert len(rig.engine.bodies) == 2


def test_seeded_sampling_is_deterministic_enough_for_the_response_tier(rig):
    body = chat("What is shown?", image(1), temperature=0.9, seed=7)
    rig.post(body)
    assert rig.post(body).json()["vlmcache"]["hit_tier"] == "response"
    other_seed = rig.post({**body, "seed": 8}).json()["vlmcache"]
    assert other_seed["statuses"]["response"] == "miss"


def test_spacing_and_sentence_case_hit_the_exact_tier_and_send_the_cached_text(tmp_path):
    rig = Rig(tmp_path, response_after_canonical=False)  # else the stored answer is sent
    rig.post(chat("What colour is the circle?", image(3), tenant="A"))
    r = rig.post(chat("  what   colour is the circle? ", image(3), tenant="A"))
    assert r.json()["vlmcache"]["hit_tier"] == "text:exact"
    sent = rig.engine.bodies[-1]["messages"][0]["content"][1]["text"]
    assert sent == "What colour is the circle?"


def test_tenants_never_share_an_entry_or_an_image_identity(rig):
    rig.post(chat("What is shown?", image(1), tenant="A"))
    r = rig.post(chat("What is shown?", image(1), tenant="B"))
    statuses = r.json()["vlmcache"]["statuses"]
    assert statuses["response"] == "miss" and statuses["exact_text"] == "miss"
    a, b = rig.engine.bodies
    assert a["cache_salt"] != b["cache_salt"] and "A" not in (a["cache_salt"], b["cache_salt"])
    uuid_a = a["messages"][0]["content"][0]["uuid"]
    uuid_b = b["messages"][0]["content"][0]["uuid"]
    assert uuid_a.startswith("vlmc-") and uuid_b.startswith("vlmc-") and uuid_a != uuid_b


def test_the_tenant_reaches_the_kv_tier_and_a_client_cannot_claim_another(rig):
    sent = chat("What is shown?", image(1), tenant="A")
    sent["kv_transfer_params"] = {"vlmcache": {"tenant": "B", "bypass": False}, "other": 1}
    rig.post(sent)
    params = rig.engine.bodies[-1]["kv_transfer_params"]
    # the front minted the image's identity: scoped (its encoder output may be stored)
    assert params == {"vlmcache": {"bypass": False, "tenant": "A", "scoped_media": True},
                      "other": 1}
    text_only = {"model": "m", "messages": [{"role": "user", "content": "Hi"}],
                 "kv_transfer_params": {"vlmcache": {"scoped_media": True}}}
    rig.post(text_only)  # a client cannot claim its media were minted by the front
    assert "scoped_media" not in rig.engine.bodies[-1]["kv_transfer_params"]["vlmcache"]
    rig.post(chat("What else?", image(2)))  # no tenant: nothing charged to anyone
    assert "tenant" not in rig.engine.bodies[-1]["kv_transfer_params"]["vlmcache"]


def test_a_client_uuid_is_replaced_by_a_pixel_derived_identity(rig):
    """The shared-uuid attack: two images under one client uuid get two identities."""
    def body(seed, tenant):
        b = chat("What is shown?", image(seed), tenant=tenant)
        b["messages"][0]["content"][0]["uuid"] = "img-shared-1"
        return b
    rig.post(body(4, None))
    rig.post(body(5, "B"))
    sent = [b["messages"][0]["content"][0]["uuid"] for b in rig.engine.bodies]
    assert "img-shared-1" not in sent and sent[0] != sent[1]


def test_the_same_pixels_re_encoded_get_the_same_identity(rig):
    im = image(6)
    for url in (data_url(im), data_url(im, compress_level=9), data_url(im, "BMP")):
        b = chat("What is shown?", tenant="A")
        b["messages"][0]["content"].insert(0, {"type": "image_url", "image_url": {"url": url}})
        rig.post(b)
    uuids = {b["messages"][0]["content"][0]["uuid"] for b in rig.engine.bodies}
    assert len(uuids) == 1
    assert len(rig.engine.bodies) == 1  # same pixels, same question: the response tier


def test_refuse_policy_refuses_a_client_uuid(tmp_path):
    rig = Rig(tmp_path, client_image_uuids="refuse")
    b = chat("What?", image(1))
    b["messages"][0]["content"][0]["uuid"] = "x"
    r = rig.post(b)
    assert r.status_code == 400 and r.json()["error"]["param"] == "messages[0].content[0].uuid"


@pytest.mark.parametrize("policy", ["replace", "trust"])
def test_an_image_part_with_only_a_uuid_is_refused(tmp_path, policy):
    rig = Rig(tmp_path, client_image_uuids=policy)
    ref = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "image_url", "uuid": "someone-elses"}, {"type": "text", "text": "hi"}]}]}
    r = rig.post(ref)
    assert r.status_code == 400 and "uuid alone" in r.json()["error"]["message"]


def test_trust_policy_keeps_a_client_uuid(tmp_path):
    rig = Rig(tmp_path, client_image_uuids="trust")
    b = chat("What?", image(1))
    b["messages"][0]["content"][0]["uuid"] = "my-own-id"
    rig.post(b)
    assert rig.engine.bodies[0]["messages"][0]["content"][0]["uuid"] == "my-own-id"


@pytest.mark.parametrize("mutate, field", [
    (lambda b: b["messages"][0]["content"][0]["image_url"].update(
        url="data:image/png;base64,aGVsbG8="), "messages[0].content[0].image_url"),
    (lambda b: b["messages"][0]["content"][0]["image_url"].update(url="data:image/png;base64,@@"),
     "messages[0].content[0].image_url"),
    (lambda b: b["messages"][0]["content"][0]["image_url"].update(
        url="http://example.com/a.png"), "messages[0].content[0].image_url"),
    (lambda b: b.update(vlmcache={"bypas": True}), "vlmcache"),
    (lambda b: b["messages"][0]["content"].insert(0, {"type": "image_embeds",
                                                      "image_embeds": "AAAA"}),
     "messages[0].content[0]"),
    (lambda b: b["messages"][0]["content"].extend(
        [{"type": "image_url", "image_url": {"url": data_url(image(9))}}] * 8), "messages"),
])
def test_bad_requests_get_a_400_naming_the_field_and_nothing_is_cached(rig, mutate, field):
    body = chat("What is shown?", image(1), tenant="A")
    mutate(body)
    r = rig.post(body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == field
    assert rig.engine.bodies == []
    assert rig.metric("vlmcache_front_bad_requests_total", field=field) == 1
    ok = rig.post(chat("What is shown?", image(1), tenant="A"))  # still serving
    assert ok.status_code == 200 and ok.json()["vlmcache"]["statuses"]["response"] == "miss"


def test_limits_on_image_pixels_and_body_size(tmp_path):
    rig = Rig(tmp_path, max_image_pixels=16 * 16, max_request_bytes=4096)
    r = rig.post(chat("What?", image(1, size=32)))
    assert r.status_code == 400 and "pixel limit" in r.json()["error"]["message"]
    r = rig.post(b"{" + b" " * 5000 + b"}")
    assert r.status_code == 413 and r.json()["error"]["param"] == "body"
    assert rig.post(b"not json").json()["error"]["param"] == "body"
    assert rig.engine.bodies == []


def test_engine_errors_pass_through_and_are_not_recorded(rig):
    rig.engine.status = 400
    r = rig.post(chat("What is shown?", image(1)))
    assert r.status_code == 400
    rig.engine.status = 200
    r = rig.post(chat("What is shown?", image(1)))
    assert r.json()["vlmcache"]["statuses"]["response"] == "miss"


def test_bypass_skips_every_tier_but_still_mints_identities(rig):
    rig.post(chat("What is shown?", image(1)))
    r = rig.post(chat("What is shown?", image(1), vlmcache={"bypass": True}))
    body = rig.engine.bodies[-1]
    assert body["kv_transfer_params"]["vlmcache"]["bypass"] is True
    assert body["messages"][0]["content"][0]["uuid"].startswith("vlmc-")
    assert "vlmcache" not in body
    assert r.json()["vlmcache"]["statuses"]["response"] == "skip"


def test_completions_endpoint_and_other_routes(tmp_path):
    rig = Rig(tmp_path, response_after_canonical=False)  # the engine gets the cached text
    body = {"model": "m", "prompt": "Hello there", "temperature": 0, "max_tokens": 2}
    rig.post(body, "/v1/completions")
    r = rig.post({**body, "prompt": "hello   there"}, "/v1/completions")
    assert r.json()["vlmcache"]["hit_tier"] == "text:exact"
    assert rig.engine.bodies[-1]["prompt"] == "Hello there"
    r = rig.post({"anything": 1}, "/v1/other")  # default deny (issue 33)
    assert r.status_code == 404 and rig.engine.bodies[-1] != {"anything": 1}


def test_metrics_count_every_tier_per_tenant(rig):
    for _ in range(3):
        rig.post(chat("What is shown?", image(1), tenant="A"))
    rig.post(chat("What is shown?", image(1), tenant="B"))
    m = rig.metric
    assert m("vlmcache_tier_lookups_total", tier="response", tenant="A", status="hit") == 2
    assert m("vlmcache_tier_lookups_total", tier="response", tenant="A", status="miss") == 1
    assert m("vlmcache_tier_lookups_total", tier="response", tenant="B", status="miss") == 1
    assert m("vlmcache_front_requests_total", tenant="A", hit_tier="response") == 2
    assert m("vlmcache_prompt_tokens_total", tenant="A", source="loaded") == 64
    assert m("vlmcache_front_stage_seconds_count", stage="decode") == 4
    assert m("vlmcache_response_store_entries") == 2
    assert m("vlmcache_kv_path_total", tenant="B", field="tokens_loaded") == 64


def test_other_generation_routes_refuse_client_identities_and_embeds(rig):
    body = {"model": "m", "input": [{"role": "user", "content": [
        {"type": "input_image", "image_url": "data:,", "uuid": "img-shared-1"}]}]}
    r = rig.post(body, "/v1/responses")
    assert r.status_code == 400 and r.json()["error"]["param"] == "uuid"
    r = rig.post({"model": "m", "prompt_embeds": "AAAA"}, "/v1/messages")
    assert r.status_code == 400 and r.json()["error"]["param"] == "prompt_embeds"
    assert rig.engine.bodies == []
    rig.post({"model": "m", "input": "hi"}, "/v1/responses")
    assert rig.engine.bodies == [{"model": "m", "input": "hi"}]


class _ImageServer:
    """A loopback HTTP server answering /ok.png with a PNG and anything else with 404."""

    def __init__(self, png: bytes) -> None:
        import threading

        import uvicorn

        from vlmcache.testing.server import free_port

        async def app(scope, receive, send):
            ok = scope["path"] == "/ok.png"
            await send({"type": "http.response.start", "status": 200 if ok else 404,
                        "headers": [(b"content-type", b"image/png")]})
            await send({"type": "http.response.body", "body": png if ok else b""})

        self.url = f"http://127.0.0.1:{free_port()}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1",
                                                    port=int(self.url.rsplit(":", 1)[1]),
                                                    log_level="warning", lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        import time
        while not self.server.started:
            time.sleep(0.02)

    def close(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=5)


def test_remote_images_are_fetched_by_the_front_when_allowed(tmp_path):
    import base64

    png = base64.b64decode(data_url(image(7)).split(",", 1)[1])
    server = _ImageServer(png)
    try:
        rig = Rig(tmp_path, remote_images="fetch", max_image_bytes=len(png) + 10)
        body = chat("What?")
        body["messages"][0]["content"].insert(0, {"type": "image_url", "image_url": {
            "url": server.url + "/ok.png"}})
        assert rig.post(body).status_code == 200
        sent = rig.engine.bodies[0]["messages"][0]["content"][0]
        assert sent["image_url"]["url"].startswith("data:image/png;base64,")
        assert sent["uuid"].startswith("vlmc-")
        body["messages"][0]["content"][0]["image_url"]["url"] = server.url + "/missing.png"
        r = rig.post(body)
        assert r.status_code == 400 and "HTTP 404" in r.json()["error"]["message"]
        (tmp_path / "small").mkdir()
        small = Rig(tmp_path / "small", remote_images="fetch", max_image_bytes=10)
        body["messages"][0]["content"][0]["image_url"]["url"] = server.url + "/ok.png"
        r = small.post(body)
        assert r.status_code == 400 and "byte limit" in r.json()["error"]["message"]
    finally:
        server.close()


def test_lone_surrogates_from_clients_never_crash_the_front(rig):
    raw = json.dumps(chat("Is it \ud800 red?", image(1), tenant="t\udc00"))
    for _ in range(2):
        r = rig.post(raw, headers={"content-type": "application/json"})
        assert r.status_code == 200, r.text
    assert r.json()["vlmcache"]["hit_tier"] == "response"
    from prometheus_client import generate_latest

    assert b"vlmcache_tier_lookups_total" in generate_latest(rig.registry)


def test_a_failing_tier_is_a_miss_not_an_error(rig, caplog):
    def broken(*args, **kwargs):
        raise RuntimeError("index exploded")

    rig.front.cascade.resolve = broken
    r = rig.post(chat("What is shown?", image(1)))
    assert r.status_code == 200 and "exact_text" not in r.json()["vlmcache"]["statuses"]
    assert "cascade lookup failed" in caplog.text
    assert rig.engine.bodies[0]["messages"][0]["content"][0]["uuid"].startswith("vlmc-")
