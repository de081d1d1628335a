import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fakes import chat, image  # noqa: E402

from vlmcache.cascade import Resolution, Rewrite  # noqa: E402
from vlmcache.config import VlmCacheConfig  # noqa: E402
from vlmcache.errors import RequestError  # noqa: E402
from vlmcache.keys import image_uuid, is_minted_image_uuid, tenant_cache_salt  # noqa: E402
from vlmcache.serving.openai_req import (decode_transcript, encode_transcript,  # noqa: E402
                                         parse_request)
from vlmcache.serving.rewrite import rewrite_body  # noqa: E402
from vlmcache.tiers.semantic_text import QUESTION_LAYER  # noqa: E402

CFG = VlmCacheConfig(tenant_salt="s3cret")


def test_transcript_round_trips_and_keeps_structure():
    msgs = [["system", "Be brief."], ["user", [None, "<image>", 'Say "hi"\nthen stop.']]]
    text = encode_transcript(msgs)
    assert decode_transcript(text) == [("system", ["Be brief."]),
                                       ("user", ["<media>", "<image>", 'Say "hi"\nthen stop.'])]
    assert decode_transcript("not a transcript") is None


def test_parse_finds_images_tenant_and_question():
    body = chat("What is it?", image(1), image(2), tenant="A")
    req = parse_request("chat", body, {}, CFG)
    assert req.tenant == "A" and len(req.images) == 2 and req.question == "What is it?"
    assert req.images[0].content_hash != req.images[1].content_hash
    ident = req.identity_body()
    assert ident["messages"][0]["content"][0] == {"type": "image",
                                                   "sha256": req.images[0].content_hash}
    assert "cache_salt" not in ident and body["messages"][0]["content"][0]["type"] == \
        "image_url"


def test_tenant_header_and_conflicts():
    body = chat("Q?", image(1))
    assert parse_request("chat", body, {"x-vlmcache-tenant": "T"}, CFG).tenant == "T"
    with pytest.raises(RequestError, match="cache_salt"):
        parse_request("chat", {**body, "cache_salt": "A"}, {"x-vlmcache-tenant": "T"}, CFG)


def test_rewrite_mints_identities_salts_and_replaces_the_question():
    req = parse_request("chat", chat("Which colour is it?", image(1), tenant="A"), {}, CFG)
    res = Resolution("ignored", QUESTION_LAYER, 0.9, {}, None, req.image_hashes, None,
                     Rewrite(QUESTION_LAYER, "p", "What colour is it?"))
    body = rewrite_body(req, res, CFG)
    part = body["messages"][0]["content"][0]
    assert part["uuid"] == image_uuid("s3cret", "A", req.images[0].content_hash)
    assert is_minted_image_uuid(part["uuid"])
    assert body["cache_salt"] == tenant_cache_salt("s3cret", "A")
    assert body["messages"][0]["content"][1]["text"] == "What colour is it?"


def test_rewrite_applies_a_cached_transcript_only_when_it_fits():
    req = parse_request("chat", chat("what is it?", image(1)), {}, CFG)
    cached = encode_transcript([["user", ["<image>", "What is it?"]]])
    res = Resolution(cached, "text:exact", 1.0, {}, None, req.image_hashes)
    assert rewrite_body(req, res, CFG)["messages"][0]["content"][1]["text"] == "What is it?"
    wrong = encode_transcript([["user", ["What is it?", "<image>"]]])
    res = Resolution(wrong, "text:exact", 1.0, {}, None, req.image_hashes)
    assert rewrite_body(req, res, CFG)["messages"][0]["content"][1]["text"] == "what is it?"
