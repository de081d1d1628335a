"""``response_after_canonical``: the response tier asked again under the canonical request's
key after the cascade rewrote a request (CPU fake engine, no vLLM)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fakes import (chat, clip_bytes, clip_frames, data_url, delta_text, image,  # noqa: E402
                   sse_events, video_chat)
from test_front_asgi import Rig  # noqa: E402

from vlmcache.config import VlmCacheConfig  # noqa: E402
from vlmcache.serving.openai_req import parse_request  # noqa: E402
from vlmcache.serving.rewrite import forward_identity, rewrite_body  # noqa: E402
from vlmcache.tiers.response import canonical_request  # noqa: E402

QUESTION = "What colour is the circle?"
SPACED = "  what   colour is the circle? "


def _on(tmp_path: Path, **config) -> Rig:
    return Rig(tmp_path, response_after_canonical=True, **config)


def _report(response) -> dict:
    return response.json()["vlmcache"]


def test_off_a_normalized_repeat_goes_to_the_engine(tmp_path):
    rig = Rig(tmp_path, response_after_canonical=False)
    assert VlmCacheConfig().response_after_canonical  # on by default
    rig.post(chat(QUESTION, image(3), tenant="A"))
    r = _report(rig.post(chat(SPACED, image(3), tenant="A")))
    assert r["hit_tier"] == "text:exact" and r["statuses"]["response"] == "miss"
    assert r["canonical_tier"] is None and "canonical_lookup" not in r["front_ms"]
    assert len(rig.engine.bodies) == 2


def test_on_an_exact_tier_rewrite_is_answered_with_the_canonical_answer(tmp_path):
    rig = _on(tmp_path)
    first = rig.post(chat(QUESTION, image(3), tenant="A")).json()
    second = rig.post(chat(SPACED, image(3), tenant="A"))
    r = _report(second)
    assert len(rig.engine.bodies) == 1
    assert second.headers["x-vlmcache-hit-tier"] == "response"
    assert json.loads(second.headers["x-vlmcache-statuses"])["exact_text"] == "hit"
    assert r["hit_tier"] == "response" and r["canonical_tier"] == "text:exact"
    assert r["statuses"]["response"] == "hit" and r["statuses"]["exact_text"] == "hit"
    assert r["canonical_prompt"] and QUESTION in r["canonical_prompt"]
    assert second.json()["choices"] == first["choices"]
    assert second.json()["id"] != first["id"]
    assert rig.metric("vlmcache_tier_lookups_total", tier="response", tenant="A",
                      status="hit") == 1
    assert rig.metric("vlmcache_tier_lookups_total", tier="exact_text", tenant="A",
                      status="hit") == 1


def test_an_engine_answer_to_a_rewritten_request_is_stored_under_both_keys(tmp_path):
    rig = _on(tmp_path)
    rig.post(chat(QUESTION, image(3), tenant="A"))
    # other sampling: the exact tier rewrites the text, but no answer is stored for it
    miss = _report(rig.post(chat(SPACED, image(3), tenant="A", max_tokens=8)))
    assert miss["hit_tier"] == "text:exact" and miss["statuses"]["response"] == "miss"
    assert len(rig.engine.bodies) == 2
    canonical = _report(rig.post(chat(QUESTION, image(3), tenant="A", max_tokens=8)))
    assert canonical["hit_tier"] == "response" and canonical["canonical_tier"] is None
    again = _report(rig.post(chat(SPACED, image(3), tenant="A", max_tokens=8)))
    assert again["hit_tier"] == "response" and again["canonical_tier"] is None  # as sent
    assert len(rig.engine.bodies) == 2


def test_with_the_key_off_only_the_as_sent_key_is_stored(tmp_path):
    rig = Rig(tmp_path, response_after_canonical=False)
    rig.post(chat(QUESTION, image(3), tenant="A"))
    rig.post(chat(SPACED, image(3), tenant="A", max_tokens=8))
    r = _report(rig.post(chat(QUESTION, image(3), tenant="A", max_tokens=8)))
    assert r["statuses"]["response"] == "miss" and len(rig.engine.bodies) == 3


def test_a_canonical_answer_never_crosses_tenants(tmp_path):
    rig = _on(tmp_path)
    rig.post(chat(QUESTION, image(3), tenant="A"))
    r = _report(rig.post(chat(SPACED, image(3), tenant="B")))
    assert r["statuses"]["response"] == "miss" and len(rig.engine.bodies) == 2
    # even a cascade that canonicalized B's request to A's records finds no answer for B
    resolve = rig.front.cascade.resolve
    rig.front.cascade.resolve = lambda *a, **kw: resolve(*a[:2], "A", **kw)
    r = _report(rig.post(chat(SPACED + " ", image(3), tenant="B")))
    assert r["hit_tier"] == "text:exact" and r["statuses"]["response"] == "miss"
    assert len(rig.engine.bodies) == 3


@pytest.mark.parametrize("sampling", [{"temperature": 0.7}, {"temperature": 0, "n": 2},
                                      {"vlmcache": {"response_cache": False}}])
def test_non_deterministic_or_opted_out_requests_are_never_served(tmp_path, sampling):
    rig = _on(tmp_path)
    rig.post(chat(QUESTION, image(3), tenant="A"))
    rig.post(chat(QUESTION, image(3), tenant="A", **sampling))
    for _ in range(2):
        r = _report(rig.post(chat(SPACED, image(3), tenant="A", **sampling)))
        assert r["statuses"]["response"] == "skip" and r["hit_tier"] == "text:exact"
    assert len(rig.engine.bodies) == 4


def test_a_canonical_hit_streams_the_stored_answer_with_its_report(tmp_path):
    rig = _on(tmp_path)
    first = rig.post(chat(QUESTION, image(3), tenant="A")).json()
    streamed = rig.post(chat(SPACED, image(3), tenant="A", stream=True,
                             stream_options={"include_usage": True}))
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert streamed.headers["x-vlmcache-hit-tier"] == "response"
    events = sse_events(streamed)
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    text = delta_text(chunks)
    assert text == first["choices"][0]["message"]["content"]
    assert any(c.get("usage") for c in chunks)
    report = chunks[-1]["vlmcache"]
    assert report["hit_tier"] == "response" and report["canonical_tier"] == "text:exact"
    assert len(rig.engine.bodies) == 1


def test_a_streamed_engine_answer_is_stored_under_the_canonical_key(tmp_path):
    rig = _on(tmp_path)
    rig.post(chat(QUESTION, image(3), tenant="A"))
    streamed = rig.post(chat(SPACED, image(3), tenant="A", max_tokens=8, stream=True))
    assert json.loads(sse_events(streamed)[-2])["vlmcache"]["hit_tier"] == "text:exact"
    r = _report(rig.post(chat(QUESTION, image(3), tenant="A", max_tokens=8)))
    assert r["hit_tier"] == "response" and len(rig.engine.bodies) == 2


def test_a_normalized_completions_prompt_gets_the_canonical_answer(tmp_path):
    rig = _on(tmp_path)
    body = {"model": "m", "prompt": "Hello there", "temperature": 0, "max_tokens": 2}
    first = rig.post(body, "/v1/completions").json()
    r = rig.post({**body, "prompt": "hello   there"}, "/v1/completions").json()
    assert r["vlmcache"]["hit_tier"] == "response" and r["choices"] == first["choices"]
    assert r["vlmcache"]["canonical_tier"] == "text:exact" and len(rig.engine.bodies) == 1


def _jpeg_chat(question: str, im, tenant: str) -> dict:
    body = chat(question, tenant=tenant)
    body["messages"][0]["content"].insert(0, {"type": "image_url", "image_url": {
        "url": data_url(im, "JPEG", quality=90)}})
    return body


@pytest.mark.parametrize("on", [False, True])
def test_a_near_duplicate_image_gets_the_canonical_answer_only_when_on(tmp_path, on):
    rig = Rig(tmp_path, enable_image_embedding=True, response_after_canonical=on)
    im = image(3, size=64)
    first = rig.post(chat(QUESTION, im, tenant="A")).json()
    r = rig.post(_jpeg_chat(QUESTION, im, "A")).json()
    report = r["vlmcache"]
    assert report["statuses"]["embedding:vision"] == "hit", report
    if not on:
        assert report["hit_tier"] == "embedding:vision" and len(rig.engine.bodies) == 2
        return
    assert report["hit_tier"] == "response" and report["canonical_tier"] == "embedding:vision"
    sent = parse_request("chat", chat(QUESTION, im), {}, rig.front.config)
    assert report["canonical_images"] == list(sent.image_hashes)  # the first one's pixels
    assert len(report["image_similarity"]) == 1 and r["choices"] == first["choices"]
    assert len(rig.engine.bodies) == 1
    other = rig.post(_jpeg_chat(QUESTION, im, "B")).json()["vlmcache"]  # B has no image
    assert other["statuses"]["response"] == "miss" and len(rig.engine.bodies) == 2


def test_a_near_duplicate_video_gets_the_canonical_answer(tmp_path):
    rig = _on(tmp_path, enable_video_near_duplicates=True)
    frames = clip_frames()
    first = rig.post(video_chat("What moves?", clip_bytes(frames, "ffv1"), tenant="A")).json()
    r = rig.post(video_chat("What moves?", clip_bytes(frames, "mp4v"), tenant="A")).json()
    report = r["vlmcache"]
    assert report["statuses"]["video:near_duplicate"] == "hit", report
    assert report["hit_tier"] == "response"
    assert report["canonical_tier"] == "video:near_duplicate"
    assert report["videos"] == first["vlmcache"]["videos"]
    assert r["choices"] == first["choices"] and len(rig.engine.bodies) == 1


def test_forward_identity_is_the_as_sent_identity_of_the_canonical_request(tmp_path):
    """The canonical key is what the canonical request's own as-sent key was."""
    rig = _on(tmp_path)
    config = rig.front.config
    rig.post(chat(QUESTION, image(3), tenant="A"))
    canonical = parse_request("chat", chat(QUESTION, image(3), tenant="A"), {}, config)
    variant = parse_request("chat", chat(SPACED, image(3), tenant="A", stream=True), {},
                            config)
    res = rig.front._resolve(variant)
    assert res is not None and res.hit_tier == "text:exact"
    forward = rewrite_body(variant, res, config)
    assert forward_identity(variant, res, forward) == {
        **canonical.identity_body(), "stream": True,
        "kv_transfer_params": forward["kv_transfer_params"]}  # transport fields: not keyed
    alone = rewrite_body(canonical, None, config)  # a request the cascade left alone
    assert canonical_request("chat", forward_identity(canonical, None, alone)) \
        == canonical_request("chat", canonical.identity_body())


def test_a_paraphrase_gets_the_canonical_answer(tmp_path):
    pytest.importorskip("sentence_transformers")
    rig = _on(tmp_path, enable_semantic_text=True)
    first = rig.post(chat("What color is the shape?", image(3), tenant="A")).json()
    r = rig.post(chat("Which colour is the shape?", image(3), tenant="A")).json()
    report = r["vlmcache"]
    assert report["canonical_tier"] in ("semantic_text", "embedding:prompt"), report
    assert report["hit_tier"] == "response" and report["similarity"] < 1.0
    assert report["statuses"][report["canonical_tier"]] == "hit"
    assert r["choices"] == first["choices"] and len(rig.engine.bodies) == 1
