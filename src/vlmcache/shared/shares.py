"""What replicas tell each other: typed records of the cascade's tiers, as JSON.

Decoding is strict (types checked field by field): an entry that does not decode is
rejected, never half-applied.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Union

MAX_TEXT = 1 << 20


@dataclass(frozen=True)
class ExactShare:
    """An exact-tier record: this prompt (normalized) about these images has KV here."""

    prompt: str
    image_hashes: tuple[str, ...]
    tenant: str | None
    chunk_keys: tuple[str, ...]
    prompt_tokens: int


@dataclass(frozen=True)
class ImageShare:
    """A canonical image; its pixels are in the shared ``images`` chunk store at ``pixel_key``."""

    content_hash: str
    tenant: str | None
    pixel_key: str


@dataclass(frozen=True)
class TextShare:
    """A canonical question/prompt about canonical images (the paraphrase tiers' entry)."""

    question: str
    prompt: str
    context: str
    tenant: str | None


Share = Union[ExactShare, ImageShare, TextShare]
KINDS: dict[str, type] = {"exact": ExactShare, "image": ImageShare, "text": TextShare}


def kind_of(share: Share) -> str:
    for kind, cls in KINDS.items():
        if isinstance(share, cls):
            return kind
    raise TypeError(f"not a share: {type(share).__name__}")


def encode(share: Share) -> str:
    return json.dumps(asdict(share), separators=(",", ":"), ensure_ascii=False)


def decode(kind: str, body: str) -> Share | None:
    """The share, or ``None`` when ``body`` is not a valid record of ``kind``."""
    try:
        d = json.loads(body)
    except ValueError:
        return None
    if not isinstance(d, dict):
        return None
    try:
        if kind == "exact":
            return ExactShare(_str(d["prompt"]), _strs(d["image_hashes"]), _tenant(d["tenant"]),
                              _strs(d["chunk_keys"]), _int(d["prompt_tokens"]))
        if kind == "image":
            return ImageShare(_str(d["content_hash"]), _tenant(d["tenant"]),
                              _str(d["pixel_key"]))
        if kind == "text":
            return TextShare(_str(d["question"]), _str(d["prompt"]), _str(d["context"]),
                             _tenant(d["tenant"]))
    except (KeyError, TypeError, ValueError):
        return None
    return None


def _str(v: object) -> str:
    if not isinstance(v, str) or len(v) > MAX_TEXT:
        raise TypeError("expected a string")
    return v


def _tenant(v: object) -> str | None:
    return None if v is None else _str(v)


def _strs(v: object) -> tuple[str, ...]:
    if not isinstance(v, list):
        raise TypeError("expected a list of strings")
    return tuple(_str(x) for x in v)


def _int(v: object) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise TypeError("expected a non-negative integer")
    return v
