"""Base64 and JSON for request bodies: the fast libraries where installed, the same
results as the standard library either way."""

from __future__ import annotations

import base64
import binascii
import json

import pytest

from vlmcache.errors import RequestError
from vlmcache.serving import wire
from vlmcache.serving.openai_req import load_body

GOOD = [base64.b64encode(bytes(range(n))).decode() for n in (0, 1, 2, 3, 64, 255)]
BAD = ["abc", "ab=c", "YWJj\n", "YW Jj", "YWJj!", "=YWJj", "YWJjZA=", "é"]


@pytest.fixture(params=["fast", "stdlib"])
def libs(request, monkeypatch):
    if request.param == "stdlib":
        monkeypatch.setattr(wire, "_b64", None)
        monkeypatch.setattr(wire, "_orjson", None)
    return request.param


@pytest.mark.parametrize("text", GOOD)
def test_base64_decodes_as_the_standard_library(libs, text):
    assert wire.b64decode(text) == base64.b64decode(text, validate=True)
    assert wire.b64encode(base64.b64decode(text)) == text


@pytest.mark.parametrize("text", BAD)
def test_base64_refuses_what_the_standard_library_refuses(libs, text):
    with pytest.raises((binascii.Error, ValueError)):
        base64.b64decode(text, validate=True)
    with pytest.raises((binascii.Error, ValueError)):
        wire.b64decode(text)


def test_a_body_is_written_as_the_same_json(libs):
    body = {"model": "m", "messages": [{"role": "user", "content": [
        {"type": "text", "text": "what is \u00e9 \u4e2d \"quoted\" \\ \n?"},
        {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + GOOD[-1]},
         "uuid": "abc"}]}], "max_tokens": 8, "temperature": 0.5, "stop": None,
        "logit_bias": {"5": -1.5}, "seed": -3}
    assert json.loads(wire.dump_json(body)) == body


def test_what_orjson_cannot_write_the_standard_library_writes(libs):
    body = {"seed": 2**70, "text": "lone \ud800 surrogate"}
    assert json.loads(wire.dump_json(body)) == body


def test_nan_and_the_infinities_are_refused_by_name():
    for constant in ("NaN", "Infinity", "-Infinity", "1e400", "-2.5e999"):
        with pytest.raises(RequestError, match=f"body: not valid JSON.*{constant}"):
            load_body(b'{"temperature": %s}' % constant.encode())
    assert load_body(b'{"temperature": 0.5}') == {"temperature": 0.5}


@pytest.mark.parametrize("raw", [
    b'{"seed": 1180591620717411303424}',  # past 64 bits: orjson refuses, json takes
    b'{"text": "lone \\ud800"}', b'{"a": 1, "a": 2}', b'{"f": 1e-320, "g": -0.0}',
    '{"t": "\u00e9\u4e2d"}'.encode()])
def test_a_body_parses_to_the_standard_librarys_value(libs, raw):
    assert wire.load_json(raw) == json.loads(raw)


@pytest.mark.parametrize("raw", [b'{"a": 1,}', b'{"a": "\x01"}', b"[1] x", b'{"a": NaN}'])
def test_what_the_standard_library_refuses_is_refused(libs, raw):
    with pytest.raises(ValueError):
        wire.load_json(raw)
