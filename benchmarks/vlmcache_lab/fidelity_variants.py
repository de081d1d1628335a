"""Image variants of an easy-vqa image for the fidelity benchmark: benign ones (the same
image for every question) and hard negatives (a change a VQA answer hinges on).

Every generator takes the source image (64x64 RGB, one shape on a flat background) and
its :class:`ShapeAttrs`, and returns ``None`` when the change would not change the image
in a way that matters (a channel permutation of a grey shape, a mirror that is only a small
shift), so that a hard negative is always a real one. Kinds are named ``benign:*`` and
``hard:*``; the hard ones carry ``recolour``, ``mirror`` or ``count`` in their names.
"""

from __future__ import annotations

import colorsys
import io
from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np

from vlmcache_lab.fidelity_data import ShapeAttrs

#: easy-vqa colours a channel permutation or hue shift leaves as they are (no hue).
_HUELESS = ("black", "gray")
#: A mirror must move the shape's centre by more than this (px) to be a hard negative:
#: twice the 8 px of translation the image verifier registers, so a mirror is never a
#: "small shift", and the shape changes side ("is the shape on the left?" flips).
MIRROR_MIN_OFFSET_PX = 8


@dataclass(frozen=True)
class Variant:
    """A generated image and the question whose answer the change hinges on."""

    image: Any
    question: str
    attrs: ShapeAttrs  # the variant's own attributes (answers its question)
    gt: str = ""  # ground truth when the question is not an easy-vqa template


VariantFn = Callable[[Any, ShapeAttrs, np.random.Generator, str], Optional[Variant]]


def _arr(image: Any) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.float32)


def _img(arr: np.ndarray) -> Any:
    from PIL import Image

    return Image.fromarray(np.clip(arr, 0, 255).round().astype(np.uint8), "RGB")


def background(arr: np.ndarray) -> np.ndarray:
    """The background colour: the most common border colour."""
    border = np.concatenate([arr[0], arr[-1], arr[:, 0], arr[:, -1]]).astype(np.int32)
    colours, counts = np.unique(border, axis=0, return_counts=True)
    return colours[counts.argmax()].astype(np.float32)


def shape_mask(arr: np.ndarray) -> np.ndarray:
    """Pixels that differ from the background (the shape, anti-aliasing included)."""
    return np.abs(arr - background(arr)).max(axis=2) > 24


def jpeg(image: Any, attrs: ShapeAttrs, rng: np.random.Generator, q: str) -> Variant:
    from PIL import Image

    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=35)
    return Variant(Image.open(io.BytesIO(buf.getvalue())).convert("RGB"), q, attrs)


def noise(image: Any, attrs: ShapeAttrs, rng: np.random.Generator, q: str) -> Variant:
    arr = _arr(image)
    return Variant(_img(arr + rng.normal(0, 6, arr.shape)), q, attrs)


def brightness(image: Any, attrs: ShapeAttrs, rng: np.random.Generator, q: str) -> Variant:
    return Variant(_img(_arr(image) * float(rng.choice([0.85, 1.15]))), q, attrs)


def shift(image: Any, attrs: ShapeAttrs, rng: np.random.Generator, q: str) -> Variant:
    """Moved 2-3 px in x and y (edges repeat the background)."""
    arr = _arr(image)
    dx, dy = (int(rng.integers(2, 4)) * int(rng.choice([-1, 1])) for _ in range(2))
    padded = np.pad(arr, ((3, 3), (3, 3), (0, 0)), mode="edge")
    h, w = arr.shape[:2]
    return Variant(_img(padded[3 - dy:3 - dy + h, 3 - dx:3 - dx + w]), q, attrs)


def crop(image: Any, attrs: ShapeAttrs, rng: np.random.Generator, q: str) -> Optional[Variant]:
    """90-95% of each side kept (at a random offset), resized back; None if it cuts the shape."""
    from PIL import Image

    w, h = image.size
    keep = float(rng.uniform(0.90, 0.95))
    cw, ch = int(w * keep), int(h * keep)
    x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    mask = shape_mask(_arr(image))
    if mask.sum() != mask[y0:y0 + ch, x0:x0 + cw].sum():
        return None
    return Variant(image.crop((x0, y0, x0 + cw, y0 + ch)).resize((w, h), Image.BICUBIC),
                   q, attrs)


def rescale(image: Any, attrs: ShapeAttrs, rng: np.random.Generator, q: str) -> Variant:
    """The same picture at another resolution (48 or 96 px)."""
    from PIL import Image

    side = int(rng.choice([48, 96]))
    return Variant(image.resize((side, side), Image.BICUBIC), q, attrs)


def recolour_permute(image: Any, attrs: ShapeAttrs, rng: np.random.Generator,
                     q: str) -> Optional[Variant]:
    """RGB channels permuted (the shape changes colour); None for hueless shapes."""
    if attrs.color in _HUELESS:
        return None
    order = [(1, 2, 0), (2, 0, 1)][int(rng.integers(2))]
    return Variant(_img(_arr(image)[:, :, order]), f"is there a {attrs.color} shape?",
                   ShapeAttrs(attrs.shape, "?"), gt="no")


def recolour_hue(image: Any, attrs: ShapeAttrs, rng: np.random.Generator,
                 q: str) -> Optional[Variant]:
    """The shape's hue turned by 90-270 degrees (background kept); None for hueless."""
    if attrs.color in _HUELESS:
        return None
    arr = _arr(image)
    mask = shape_mask(arr)
    turn = float(rng.uniform(0.25, 0.75))
    out = arr.copy()
    for y, x in zip(*np.nonzero(mask)):
        hh, ss, vv = colorsys.rgb_to_hsv(*(arr[y, x] / 255.0))
        out[y, x] = np.asarray(colorsys.hsv_to_rgb((hh + turn) % 1.0, ss, vv)) * 255.0
    return Variant(_img(out), f"is there a {attrs.color} shape?", ShapeAttrs(attrs.shape, "?"),
                   gt="no")


#: Sepia toning's colour matrix (the common photo-editor one).
SEPIA = np.array([[0.393, 0.769, 0.189], [0.349, 0.686, 0.168], [0.272, 0.534, 0.131]],
                 np.float32)


def greyscale_arr(arr: np.ndarray) -> np.ndarray:
    """``(H, W, 3)`` float RGB in greyscale (BT.601 luma in every channel)."""
    luma = arr @ np.array([0.299, 0.587, 0.114], np.float32)
    return np.repeat(luma[..., None], 3, axis=2)


def desaturated_arr(arr: np.ndarray, keep: float) -> np.ndarray:
    """``arr`` with ``keep`` of its saturation (a photo editor's saturation slider)."""
    grey = greyscale_arr(arr)
    return grey + keep * (arr - grey)


def _colour_edit(attrs: ShapeAttrs, arr: np.ndarray) -> Variant:
    return Variant(_img(arr), f"is there a {attrs.color} shape?", ShapeAttrs(attrs.shape, "?"),
                   gt="no")


def recolour_greyscale(image: Any, attrs: ShapeAttrs, rng: np.random.Generator,
                       q: str) -> Optional[Variant]:
    """The whole image in greyscale (a photo editor's black & white); None for hueless."""
    if attrs.color in _HUELESS:
        return None
    return _colour_edit(attrs, greyscale_arr(_arr(image)))


def recolour_desaturate(image: Any, attrs: ShapeAttrs, rng: np.random.Generator,
                        q: str) -> Optional[Variant]:
    """Saturation down to 25-40% (red turns a greyish pink); None for hueless."""
    if attrs.color in _HUELESS:
        return None
    return _colour_edit(attrs, desaturated_arr(_arr(image), float(rng.uniform(0.25, 0.40))))


def recolour_sepia(image: Any, attrs: ShapeAttrs, rng: np.random.Generator,
                   q: str) -> Optional[Variant]:
    """Sepia toning (every colour turns a shade of brown); None for hueless and brown."""
    if attrs.color in (*_HUELESS, "brown"):
        return None
    return _colour_edit(attrs, _arr(image) @ SEPIA.T)


def mirror(image: Any, attrs: ShapeAttrs, rng: np.random.Generator,
           q: str) -> Optional[Variant]:
    """Left-right mirror, only where the shape's centre is > 8 px off the middle."""
    arr = _arr(image)
    ys, xs = np.nonzero(shape_mask(arr))
    if len(xs) == 0:
        return None
    centre = float(xs.mean())
    offset = centre - (arr.shape[1] - 1) / 2
    if abs(offset) <= MIRROR_MIN_OFFSET_PX:
        return None
    side = "left" if offset > 0 else "right"  # where the mirrored shape is
    return Variant(_img(arr[:, ::-1]), "is the shape on the left?", attrs,
                   gt="yes" if side == "left" else "no")


def count_remove(image: Any, attrs: ShapeAttrs, rng: np.random.Generator,
                 q: str) -> Optional[Variant]:
    """The shape painted over with the background (no shape left)."""
    arr = _arr(image)
    mask = shape_mask(arr)
    if not mask.any():
        return None
    grown = mask | np.roll(mask, 1, 0) | np.roll(mask, -1, 0) | np.roll(mask, 1, 1) \
        | np.roll(mask, -1, 1)
    arr[grown] = background(arr)
    return Variant(_img(arr), f"is there a {attrs.shape}?", attrs, gt="no")


def count_add(image: Any, attrs: ShapeAttrs, rng: np.random.Generator,
              q: str) -> Optional[Variant]:
    """A second shape (another kind, 12-16 px) drawn where the image is background."""
    from PIL import ImageDraw

    from vlmcache.models.paraphrases import SHAPES

    arr = _arr(image)
    mask = shape_mask(arr)
    kind = str(rng.choice([s for s in SHAPES if s != attrs.shape]))
    size = int(rng.integers(12, 17))
    for _ in range(50):
        x, y = (int(v) for v in rng.integers(2, 62 - size, 2))
        if not mask[max(0, y - 2):y + size + 2, max(0, x - 2):x + size + 2].any():
            break
    else:
        return None
    out = _img(arr)
    colour = tuple(int(v) for v in rng.integers(0, 200, 3))
    draw = ImageDraw.Draw(out)
    if kind == "circle":
        draw.ellipse([x, y, x + size, y + size], fill=colour)
    elif kind == "rectangle":
        draw.rectangle([x, y, x + size, y + size * 2 // 3], fill=colour)
    else:
        draw.polygon([(x, y + size), (x + size // 2, y), (x + size, y + size)], fill=colour)
    return Variant(out, f"is there a {kind}?", attrs, gt="yes")


BENIGN: dict[str, VariantFn] = {
    "benign:jpeg_q35": jpeg, "benign:noise_s6": noise, "benign:brightness_15pct": brightness,
    "benign:shift_2_3px": shift, "benign:crop_90_95pct": crop, "benign:rescale": rescale,
}
HARD: dict[str, VariantFn] = {
    "hard:recolour_permute": recolour_permute, "hard:recolour_hue": recolour_hue,
    "hard:recolour_greyscale": recolour_greyscale,
    "hard:recolour_desaturate": recolour_desaturate, "hard:recolour_sepia": recolour_sepia,
    "hard:mirror": mirror, "hard:count_remove": count_remove, "hard:count_add": count_add,
}
