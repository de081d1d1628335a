"""Fidelity probe sets on easy-vqa: paraphrases, near-duplicate frames, moving-shape videos,
and the negatives that must not hit (negated/recoloured questions, other images)."""

from __future__ import annotations

import io
import re
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

YES_NO = {"yes": "no", "no": "yes"}
_NEGATE = ((re.compile(r"^is there a "), "is there not a "),
           (re.compile(r"^does the image contain a "), "does the image not contain a "),
           (re.compile(r"^is a "), "is no "))


@dataclass(frozen=True)
class ShapeAttrs:
    """What is in a one-shape image: enough to answer every easy-vqa question."""

    shape: str
    color: str


@dataclass(frozen=True)
class Probe:
    """One request of the fidelity run with its ground truth."""

    category: str
    image: Any
    question: str
    attrs: ShapeAttrs
    image_id: str
    expect_hit: bool
    meaning: str = ""  # the easy-vqa template question it rewords ("": ``question``)
    gt_override: str = ""  # ground truth of a question that is no easy-vqa template
    source: str = ""  # the seed image (id) this probe's image was derived from

    @property
    def template_question(self) -> str:
        return self.meaning or self.question

    @property
    def gt(self) -> str:
        return self.gt_override or answer(self.template_question, self.attrs)


def answer(question: str, attrs: ShapeAttrs) -> str:
    """Ground truth of any easy-vqa template question for a one-shape image."""
    from vlmcache.models.paraphrases import parse_question

    template, slots = parse_question(question)
    if template.startswith("what") and "{color}" in template:
        return attrs.shape
    if template.startswith("what") and "shape" in template and "color" not in template:
        return attrs.shape
    if template.startswith("what"):
        return attrs.color
    present = (slots.get("color", attrs.color) == attrs.color
               and slots.get("shape", attrs.shape) == attrs.shape)
    negated = " not " in f" {template} " or template.startswith("is no ")
    return "yes" if present != negated else "no"


def image_attrs(questions, answers, ids) -> dict[int, ShapeAttrs]:
    """Shape and colour of each easy-vqa image, read off its what-questions."""
    shape: dict[int, str] = {}
    color: dict[int, str] = {}
    for q, a, i in zip(questions, answers, ids):
        if q.startswith("what") and a in ("circle", "rectangle", "triangle"):
            shape[i] = a
        elif q.startswith("what") and a not in ("yes", "no"):
            color[i] = a
    return {i: ShapeAttrs(shape[i], color[i]) for i in shape if i in color}


def easy_vqa_split(split: str) -> tuple[dict[int, ShapeAttrs], list[str], dict[int, list[str]]]:
    """One easy-vqa split (``"train"`` or ``"test"``): the attributes of each usable image
    (see :func:`image_attrs`), every image's path, and each image's questions."""
    import easy_vqa

    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    qs, ans, ids = getattr(easy_vqa, f"get_{split}_questions")()
    paths = getattr(easy_vqa, f"get_{split}_image_paths")()
    by_image: dict[int, list[str]] = defaultdict(list)
    for q, i in zip(qs, ids):
        by_image[i].append(q)
    return image_attrs(qs, ans, ids), paths, by_image


def near_duplicates(image: Any, rng: np.random.Generator) -> dict[str, Any]:
    """Shifted (2 px), noised (sigma 6) and JPEG re-encoded (q=75) copies."""
    from PIL import Image, ImageChops

    arr = np.asarray(image).astype(np.float32)
    noised = np.clip(arr + rng.normal(0, 6, arr.shape), 0, 255).astype(np.uint8)
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=75)
    return {"near_dup:shifted": ImageChops.offset(image, 2, 1),
            "near_dup:noised": Image.fromarray(noised),
            "near_dup:jpeg": Image.open(io.BytesIO(buf.getvalue())).convert("RGB")}


def video(attrs: ShapeAttrs, frames: int, rng: np.random.Generator) -> list[Any]:
    """A shape moving 2 px per frame over a light background (easy-vqa's look)."""
    from PIL import Image, ImageDraw

    from vlmcache.models.paraphrases import COLORS

    rgb = {"red": (220, 30, 30), "green": (40, 170, 60), "blue": (40, 60, 220),
           "black": (15, 15, 15), "gray": (128, 128, 128), "teal": (0, 128, 128),
           "brown": (140, 80, 30), "yellow": (240, 220, 30)}
    assert set(rgb) == set(COLORS)
    bg = tuple(int(v) for v in rng.integers(200, 256, 3))
    x, y, size = int(rng.integers(8, 24)), int(rng.integers(8, 30)), int(rng.integers(18, 26))
    out = []
    for f in range(frames):
        im = Image.new("RGB", (64, 64), bg)
        d, x0 = ImageDraw.Draw(im), x + 2 * f
        box = [x0, y, x0 + size, y + size]
        if attrs.shape == "circle":
            d.ellipse(box, fill=rgb[attrs.color])
        elif attrs.shape == "rectangle":
            d.rectangle([x0, y, x0 + size, y + size * 2 // 3], fill=rgb[attrs.color])
        else:
            d.polygon([(x0, y + size), (x0 + size // 2, y), (x0 + size, y + size)],
                      fill=rgb[attrs.color])
        out.append(im)
    return out


def negate(question: str) -> str | None:
    for pattern, repl in _NEGATE:
        if pattern.search(question):
            return pattern.sub(repl, question)
    return None


def recolour(question: str, rng: np.random.Generator) -> str | None:
    from vlmcache.models.paraphrases import COLORS

    found = [c for c in COLORS if re.search(rf"\b{c}\b", question)]
    if not found:
        return None
    other = [c for c in COLORS if c != found[0]]
    return re.sub(rf"\b{found[0]}\b", str(rng.choice(other)), question)
