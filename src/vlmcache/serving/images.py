"""Images of an OpenAI request: decoded once, within limits, into PIL images.

Data URLs (``data:image/png;base64,...``) are decoded here. Remote ``http(s)`` URLs are
refused with a 400 unless the deployment sets ``remote_images: fetch``; then the front
fetches them itself (size and time limits), so their pixels, not their address, identify
them.
"""

from __future__ import annotations

import binascii
import hashlib
import io
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from vlmcache.errors import RequestError
from vlmcache.serving.wire import b64decode, b64encode


@dataclass(frozen=True)
class ImageLimits:
    """What the front accepts for one image."""

    max_bytes: int
    max_pixels: int
    remote: str  # "refuse" | "fetch"
    timeout_s: float


class DecodedImages:
    """Data URLs already decoded: the same encoded bytes are decoded once (bounded LRU).

    Keyed by the SHA-256 of the URL text; the value is the decoded image and its pixel
    hash. Repeats skip the decode; a re-encode of the same pixels is decoded again and
    gets the same pixel hash. Images are shared read-only.
    """

    def __init__(self, max_entries: int = 512) -> None:
        self.max_entries = max_entries
        self._items: OrderedDict[bytes, tuple[Any, str]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, url: str, field: str, limits: ImageLimits) -> tuple[Any, str]:
        """``(image, pixel hash)`` of a data URL, from memory when seen before."""
        from vlmcache.keys import image_content_hash

        key = hashlib.sha256(url.encode("latin-1", "replace")).digest() \
            + f"{limits.max_bytes}:{limits.max_pixels}".encode()
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
        image = decode_image_url(url, field, limits)
        value = (image, image_content_hash(image))
        if url.startswith("data:"):  # a remote URL's content may change: never memoized
            with self._lock:
                self._items[key] = value
                while len(self._items) > self.max_entries:
                    self._items.popitem(last=False)
        return value


def decode_image_url(url: object, field: str, limits: ImageLimits) -> Any:
    """A PIL image (loaded, RGB/RGBA/L) from a data URL or, if allowed, a remote URL."""
    if not isinstance(url, str) or not url:
        raise RequestError(f"{field}: expected an image URL string")
    if url.startswith("data:"):
        data = _data_url_bytes(url, field, limits.max_bytes)
    elif url.startswith(("http://", "https://")):
        if limits.remote != "fetch":
            raise RequestError(f"{field}: remote image URLs are not accepted by this server; "
                               "send the image as a data URL (data:image/png;base64,...)")
        data = fetch_image_bytes(url, field, limits)
    else:
        raise RequestError(f"{field}: unsupported image URL scheme (use a data: URL)")
    return open_image(data, field, limits.max_pixels)


def _data_url_bytes(url: str, field: str, max_bytes: int) -> bytes:
    return base64_data_url(url, field, max_bytes, "image",
                           RequestError(f"{field}: image is larger than the {max_bytes}-byte "
                                        "limit"))


def base64_data_url(url: str, field: str, max_bytes: int, medium: str,
                    too_large: RequestError) -> bytes:
    """The bytes a base64 data URL of ``medium`` carries; ``too_large`` is raised past
    ``max_bytes`` (checked on the text, before decoding), a :class:`RequestError` naming
    ``field`` for anything else."""
    header, sep, payload = url.partition(",")
    if not sep or not header.endswith(";base64"):
        raise RequestError(f"{field}: a data URL must be base64 "
                           f"(data:{medium}/...;base64,...)")
    if len(payload) * 3 // 4 > max_bytes:
        raise too_large
    try:
        return b64decode(payload)
    except (binascii.Error, ValueError) as exc:
        raise RequestError(f"{field}: invalid base64 {medium} data ({exc})") from None


def open_image(data: bytes, field: str, max_pixels: int) -> Any:
    """Decode image bytes (any format PIL reads), refusing decompression bombs."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as probe:
            width, height = probe.size
            if width * height > max_pixels:
                raise RequestError(f"{field}: image is {width}x{height}, more than the "
                                   f"{max_pixels}-pixel limit")
            probe.load()
            image = probe.copy()
    except RequestError:
        raise
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise RequestError(f"{field}: cannot decode the image ({exc})") from None
    if image.mode not in ("RGB", "RGBA", "L"):
        image = image.convert("RGB")
    return image


def fetch_image_bytes(url: str, field: str, limits: ImageLimits, what: str = "image") -> bytes:
    """GET ``url`` within the time limit, reading at most ``max_bytes`` (``what``: the
    medium the errors name)."""
    import httpx

    try:
        with httpx.stream("GET", url, timeout=limits.timeout_s,
                          follow_redirects=False) as resp:
            if resp.status_code != 200:
                raise RequestError(f"{field}: fetching the {what} gave HTTP {resp.status_code}")
            chunks, size = [], 0
            for chunk in resp.iter_bytes():
                size += len(chunk)
                if size > limits.max_bytes:
                    raise RequestError(f"{field}: {what} is larger than the "
                                       f"{limits.max_bytes}-byte limit")
                chunks.append(chunk)
    except httpx.HTTPError as exc:
        raise RequestError(f"{field}: cannot fetch the {what} ({type(exc).__name__})") from None
    return b"".join(chunks)


def png_data_url(image: Any) -> str:
    """The image as a PNG data URL (what the front sends for canonical pixels)."""
    buf = io.BytesIO()
    image.save(buf, format="PNG")
    return "data:image/png;base64," + b64encode(buf.getvalue())


class PngUrls:
    """PNG data URLs already made, by the pixels' content hash (bounded LRU, in bytes).

    An image-tier hit sends the canonical image's pixels as a PNG; encoding them again
    for every hit was a quarter of the front's CPU time on that path (issue 35: 2.4 ms of
    9.5 ms for a 336 px image). Keyed by :func:`~vlmcache.keys.image_content_hash` of the
    pixels given (mode, size, pixels), so a URL is only ever reused for the same pixels;
    PNG encoding is deterministic, so the text is what :func:`png_data_url` would make.
    """

    def __init__(self, max_bytes: int = 64 * 1024**2) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, str] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, image: Any) -> str:
        """:func:`png_data_url` of ``image``, from memory when these pixels were sent."""
        from vlmcache.keys import image_content_hash

        key = image_content_hash(image)
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
        url = png_data_url(image)
        with self._lock:
            if key not in self._items and len(url) <= self.max_bytes:
                self._items[key] = url
                self._bytes += len(url)
            while self._bytes > self.max_bytes:
                self._bytes -= len(self._items.popitem(last=False)[1])
        return url
