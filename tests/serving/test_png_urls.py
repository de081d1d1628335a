"""The canonical pixels' PNG data URLs memo (issue 35): same text as a fresh encode, keyed
by the pixels themselves, bounded in bytes."""

from __future__ import annotations

import numpy as np
from PIL import Image

from vlmcache.serving.images import PngUrls, png_data_url


def _image(seed: int, mode: str = "RGB") -> Image.Image:
    arr = np.random.default_rng(seed).integers(0, 256, (24, 24, 3), dtype=np.uint8)
    return Image.fromarray(arr).convert(mode)


def test_memo_returns_what_an_encode_makes() -> None:
    urls = PngUrls()
    for seed, mode in ((0, "RGB"), (1, "L"), (2, "RGBA")):
        image = _image(seed, mode)
        assert urls.get(image) == png_data_url(image)
        assert urls.get(image.copy()) == png_data_url(image)  # same pixels, from memory


def test_other_pixels_get_their_own_url() -> None:
    urls = PngUrls()
    a, b = _image(0), _image(0)
    b.putpixel((0, 0), (1, 2, 3) if a.getpixel((0, 0)) != (1, 2, 3) else (4, 5, 6))
    assert urls.get(a) != urls.get(b)
    assert urls.get(b) == png_data_url(b)
    assert urls.get(a.convert("L")) == png_data_url(a.convert("L"))  # mode counts


def test_bounded_in_bytes() -> None:
    one = len(png_data_url(_image(0)))
    urls = PngUrls(max_bytes=2 * one + one // 2)
    for seed in range(5):
        urls.get(_image(seed))
    assert len(urls._items) == 2 and urls._bytes <= urls.max_bytes
