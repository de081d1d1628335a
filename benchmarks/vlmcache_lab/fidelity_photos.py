"""Real photographs for the fidelity benchmark, and the colour edits a photo editor offers.

The photographs ship inside installed packages (nothing is downloaded): scikit-image's
``skimage.data``, scikit-learn's sample images and matplotlib's sample data. They are
split by photograph into train (calibration) and test (evaluation): no test photograph,
nor any view of it, is ever used to pick a threshold.

A photograph gives several *views* (crops of 55-85% of its short side at a random place,
resized to 256x192): distinct images of one scene, the canonical images of the run.
Hard negatives are colour edits whose answer to a colour question changes (greyscale,
saturation down, white balance and tint moved against the picture's own cast, sepia, one
hue band recoloured, the whole hue turned, channels swapped); benign variants are the easy-vqa
ones adapted to a photograph's size (a crop need not keep a shape inside).
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from vlmcache_lab.fidelity_data import ShapeAttrs
from vlmcache_lab.fidelity_variants import (SEPIA, Variant, VariantFn, brightness,
                                            desaturated_arr, greyscale_arr, jpeg, noise, shift)

#: Photographs by name: (package, what loads it). Colour photographs only: a greyscale
#: one has no colour for an edit to change.
_SOURCES = {
    "astronaut": ("skimage", "astronaut"), "coffee": ("skimage", "coffee"),
    "rocket": ("skimage", "rocket"), "immunohistochemistry": ("skimage", "immunohistochemistry"),
    "hubble_deep_field": ("skimage", "hubble_deep_field"), "china": ("sklearn", "china.jpg"),
    "chelsea": ("skimage", "chelsea"), "retina": ("skimage", "retina"),
    "motorcycle": ("skimage", "stereo_motorcycle"), "flower": ("sklearn", "flower.jpg"),
    "grace_hopper": ("matplotlib", "grace_hopper.jpg"),
}
TRAIN_PHOTOS = ("astronaut", "coffee", "rocket", "immunohistochemistry", "hubble_deep_field",
                "china")
TEST_PHOTOS = ("chelsea", "retina", "motorcycle", "flower", "grace_hopper")
VIEW_SIZE = (256, 192)
PHOTO = ShapeAttrs("photo", "?")  # photographs have no easy-vqa ground truth
COLOUR_Q = "what color is the shape?"


def load_photo(name: str) -> Any:
    """One photograph as an RGB PIL image (from the package that ships it)."""
    from PIL import Image

    package, what = _SOURCES[name]
    if package == "skimage":
        import skimage.data

        arr = getattr(skimage.data, what)()
        arr = arr[0] if isinstance(arr, tuple) else arr  # stereo pair: the left view
        return Image.fromarray(np.asarray(arr, np.uint8)).convert("RGB")
    if package == "sklearn":
        from sklearn.datasets import load_sample_image

        return Image.fromarray(load_sample_image(what)).convert("RGB")
    import matplotlib.cbook

    with matplotlib.cbook.get_sample_data(what) as f:
        return Image.open(f).convert("RGB")


def photo_split(split: str) -> tuple[str, ...]:
    """The photographs of ``"train"`` or ``"test"``."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    return TRAIN_PHOTOS if split == "train" else TEST_PHOTOS


def views(photo: Any, k: int, rng: np.random.Generator) -> list[Any]:
    """``k`` crops of 55-85% of the photograph's short side (4:3) at random places,
    resized to ``VIEW_SIZE``."""
    from PIL import Image

    w, h = photo.size
    out = []
    for _ in range(k):
        ch = int(min(h, w * 3 / 4) * rng.uniform(0.55, 0.85))
        cw = ch * 4 // 3
        x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
        out.append(photo.crop((x0, y0, x0 + cw, y0 + ch)).resize(VIEW_SIZE, Image.BICUBIC))
    return out


def _arr(image: Any) -> np.ndarray:
    return np.asarray(image.convert("RGB"), dtype=np.float32)


def _img(arr: np.ndarray) -> Any:
    from PIL import Image

    return Image.fromarray(np.clip(arr, 0, 255).round().astype(np.uint8), "RGB")


def _hard(arr: np.ndarray, attrs: ShapeAttrs) -> Variant:
    """A recoloured image asked the colour question (its answer is what changed)."""
    return Variant(_img(arr), COLOUR_Q, ShapeAttrs(attrs.shape, "?"), gt="")


def greyscale(image: Any, attrs: ShapeAttrs, rng: np.random.Generator,
              q: str) -> Optional[Variant]:
    return _hard(greyscale_arr(_arr(image)), attrs)


def desaturate(image: Any, attrs: ShapeAttrs, rng: np.random.Generator,
               q: str) -> Optional[Variant]:
    """Saturation down to 25-40% (a photo editor's saturation slider at -60..-75)."""
    return _hard(desaturated_arr(_arr(image), float(rng.uniform(0.25, 0.40))), attrs)


def _against_cast(arr: np.ndarray, towards: np.ndarray) -> float:
    """+1 or -1: the sign that moves the picture's colour balance against its own cast
    along ``towards`` (a warm picture is made cooler: warming a red retina only clips)."""
    return -1.0 if float((arr.reshape(-1, 3).mean(axis=0) * towards).sum()) > 0 else 1.0


def temperature(image: Any, attrs: ShapeAttrs, rng: np.random.Generator,
                q: str) -> Optional[Variant]:
    """White balance moved against the picture's cast, warmer or cooler (red and blue
    gains 30-40% apart): white turns yellow-orange or blue."""
    arr = _arr(image)
    gap = float(rng.uniform(0.15, 0.20))
    sign = _against_cast(arr, np.array([1.0, 0.0, -1.0], np.float32))
    return _hard(arr * np.array([1 + sign * gap, 1.0, 1 - sign * gap], np.float32), attrs)


def tint(image: Any, attrs: ShapeAttrs, rng: np.random.Generator,
         q: str) -> Optional[Variant]:
    """Green or magenta tint against the picture's cast (green against red and blue gains
    apart by 25-35%)."""
    arr = _arr(image)
    gap = float(rng.uniform(0.12, 0.18))
    sign = _against_cast(arr, np.array([-0.5, 1.0, -0.5], np.float32))
    return _hard(arr * np.array([1 - sign * gap, 1 + sign * gap, 1 - sign * gap], np.float32),
                 attrs)


def sepia(image: Any, attrs: ShapeAttrs, rng: np.random.Generator,
          q: str) -> Optional[Variant]:
    return _hard(_arr(image) @ SEPIA.T, attrs)


def _hsv(image: Any) -> np.ndarray:
    return np.asarray(image.convert("RGB").convert("HSV"), dtype=np.int32)


def _from_hsv(hsv: np.ndarray) -> Any:
    from PIL import Image

    return Image.fromarray(hsv.astype(np.uint8), "HSV").convert("RGB")


def selective_recolour(image: Any, attrs: ShapeAttrs, rng: np.random.Generator,
                       q: str) -> Optional[Variant]:
    """The most common saturated hue band (+-20 degrees) turned by 120-240 degrees, the
    rest kept (a photo editor's "replace colour": the red car turned blue); ``None``
    when under 3% of the picture is in the band."""
    hsv = _hsv(image)
    saturated = (hsv[..., 1] > 80) & (hsv[..., 2] > 50)
    if saturated.mean() < 0.03:
        return None
    counts = np.bincount(hsv[..., 0][saturated] // 8, minlength=32)
    centre = int(counts.argmax()) * 8 + 4
    band = saturated & (np.abs((hsv[..., 0] - centre + 128) % 256 - 128) <= 14)
    if band.mean() < 0.03:
        return None
    turn = int(rng.integers(85, 171))
    hsv[..., 0] = np.where(band, (hsv[..., 0] + turn) % 256, hsv[..., 0])
    return Variant(_from_hsv(hsv), COLOUR_Q, ShapeAttrs(attrs.shape, "?"), gt="")


def hue_turn(image: Any, attrs: ShapeAttrs, rng: np.random.Generator,
             q: str) -> Optional[Variant]:
    """Every hue turned by 90-270 degrees, but not within 20 degrees of 120 or 240: those
    turns are the channel swap (``channel_swap``), the same picture as another kind."""
    hsv = _hsv(image)
    turns = [t for t in range(64, 193) if min(abs(t - 85), abs(t - 171)) > 14]
    hsv[..., 0] = (hsv[..., 0] + int(rng.choice(turns))) % 256
    return Variant(_from_hsv(hsv), COLOUR_Q, ShapeAttrs(attrs.shape, "?"), gt="")


def channel_swap(image: Any, attrs: ShapeAttrs, rng: np.random.Generator,
                 q: str) -> Optional[Variant]:
    order = [(1, 2, 0), (2, 0, 1)][int(rng.integers(2))]
    return _hard(_arr(image)[:, :, order], attrs)


def crop(image: Any, attrs: ShapeAttrs, rng: np.random.Generator, q: str) -> Variant:
    """90-95% of each side kept at a random offset, resized back."""
    from PIL import Image

    w, h = image.size
    keep = float(rng.uniform(0.90, 0.95))
    cw, ch = int(w * keep), int(h * keep)
    x0, y0 = int(rng.integers(0, w - cw + 1)), int(rng.integers(0, h - ch + 1))
    return Variant(image.crop((x0, y0, x0 + cw, y0 + ch)).resize((w, h), Image.BICUBIC),
                   q, attrs)


def rescale(image: Any, attrs: ShapeAttrs, rng: np.random.Generator, q: str) -> Variant:
    """The same picture at 0.75x or 1.5x its size."""
    from PIL import Image

    f = float(rng.choice([0.75, 1.5]))
    return Variant(image.resize((round(image.size[0] * f), round(image.size[1] * f)),
                                Image.BICUBIC), q, attrs)


PHOTO_BENIGN: dict[str, VariantFn] = {
    "photo:benign_jpeg_q35": jpeg, "photo:benign_noise_s6": noise,
    "photo:benign_brightness_15pct": brightness, "photo:benign_shift_2_3px": shift,
    "photo:benign_crop_90_95pct": crop, "photo:benign_rescale": rescale,
}
PHOTO_HARD: dict[str, VariantFn] = {
    "photo:hard_recolour_greyscale": greyscale, "photo:hard_recolour_desaturate": desaturate,
    "photo:hard_recolour_temperature": temperature, "photo:hard_recolour_tint": tint,
    "photo:hard_recolour_sepia": sepia, "photo:hard_recolour_selective": selective_recolour,
    "photo:hard_recolour_hue": hue_turn, "photo:hard_recolour_permute": channel_swap,
}
