"""Base64 and JSON at a request body's size, with the C libraries vLLM installs.

A clip sent as a data URL makes a body of megabytes, and the front handles it more than
once: it decodes the base64 to identify the media and writes the body again for the engine
(the rewritten body; held media's full body after a refusal). With the standard library a
10 MB clip costs ~28 ms of ``json.dumps`` and ~28 ms of validating ``base64.b64decode`` on
a slow core (``results/front-body/``); plain vLLM pays neither, so that is time ours adds to
every miss. ``pybase64`` (a vLLM dependency: its media loaders use it) and ``orjson`` (when
installed) do the same work in a fraction of it. Where either is missing, or ``orjson``
cannot write a value (an integer past 64 bits, a string with a lone surrogate), the
standard library does it: the bytes the engine parses mean the same either way.
"""

from __future__ import annotations

import base64
import json
import math
from typing import Any

try:  # vLLM's own dependency: present wherever its server runs
    import pybase64 as _b64
except ImportError:  # pragma: no cover - the library's base install without vLLM
    _b64 = None  # type: ignore[assignment]

try:
    import orjson as _orjson
except ImportError:  # pragma: no cover - optional
    _orjson = None  # type: ignore[assignment]


def b64decode(text: str) -> bytes:
    """Strict base64 (only the alphabet and padding; ``binascii.Error`` otherwise), as
    ``base64.b64decode(text, validate=True)``."""
    if _b64 is not None:
        return _b64.b64decode(text, validate=True)
    return base64.b64decode(text, validate=True)


def b64encode(data: bytes) -> str:
    """Standard base64 of ``data`` as text."""
    if _b64 is not None:
        return _b64.b64encode(data).decode("ascii")
    return base64.b64encode(data).decode("ascii")


def dump_json(value: Any) -> bytes:
    """A request body the front parsed (``openai_req.load_body``) and rewrote, as compact
    UTF-8 JSON for the engine.

    Only for such bodies: ``orjson`` writes NaN and the infinities as ``null``, and
    ``load_body`` refuses them (:func:`refuse_constant`), so none is in a request."""
    if _orjson is not None:
        try:
            return _orjson.dumps(value)
        except TypeError:  # orjson.JSONEncodeError: what the standard library can write
            pass
    return json.dumps(value, separators=(",", ":")).encode()


def load_json(raw: bytes) -> Any:
    """``raw`` parsed as ``json.loads`` would, less what no JSON writer can say back (NaN,
    the infinities, numbers past a double's range: :class:`ValueError`): ``orjson``
    where it takes the text (it refuses what the standard library also refuses, and more:
    integers past 64 bits, lone surrogates), the standard library for anything else, so
    the value and the error are the standard library's."""
    if _orjson is not None:
        try:
            return _orjson.loads(raw)
        except ValueError:  # orjson.JSONDecodeError: the standard library decides
            pass
    return json.loads(raw, parse_constant=refuse_constant, parse_float=finite_float)


def refuse_constant(name: str) -> Any:
    """``json.loads``' ``parse_constant``: NaN, Infinity and -Infinity are not JSON."""
    raise ValueError(f"{name} is not a JSON value")


def finite_float(text: str) -> float:
    """``json.loads``' ``parse_float``: a number past a double's range (``1e400``) would
    become an infinity, which no JSON writer can say."""
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is past the range of a JSON number")
    return value
