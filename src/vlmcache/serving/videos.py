"""Videos of an OpenAI request (``video_url`` parts): decoded once, within limits, into
the identity of the frames the engine will see.

The front decodes a video with vLLM's own loader and the model's frame sampling
(:mod:`vlmcache.vllm.video_io`), checks the limits (bytes, frame size, duration, sampled
frames: a 400 naming the field, 413 for sizes) and names the video by
:func:`~vlmcache.keys.video_content_hash`. A clip that cannot be decoded is a 400 and
nothing is cached. Data URLs only, unless the deployment sets ``remote_images: fetch``
(one policy for every medium); the fetched bytes are what vLLM then gets.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np
from blake3 import blake3

from vlmcache.config import VlmCacheConfig
from vlmcache.errors import RequestError, RequestTooLarge
from vlmcache.serving.images import ImageLimits, base64_data_url, fetch_image_bytes
from vlmcache.serving.wire import b64encode
from vlmcache.tiers.video import VideoSignature
from vlmcache.tiers.video_thumbs import FrameThumbs
from vlmcache.vllm.video_io import VideoSampling, load_video, probe_video, video_kwargs

logger = logging.getLogger(__name__)


_NO_THUMBS = np.zeros((0, 3, 64, 64), np.uint8)


class MediaTooLarge(RequestTooLarge):
    """A medium over one of the front's size limits (answered with a 413)."""


@dataclass(frozen=True)
class VideoLimits:
    """What the front accepts for one video."""

    max_bytes: int
    max_frames: int
    max_pixels: int
    max_duration_s: float
    remote: str  # "refuse" | "fetch"
    timeout_s: float

    @classmethod
    def from_config(cls, config: VlmCacheConfig) -> "VideoLimits":
        """The limits a deployment's config sets (``max_video_*``, ``remote_images``)."""
        return cls(config.max_video_bytes, config.max_video_frames, config.max_video_pixels,
                   config.max_video_duration_s, config.remote_images,
                   config.remote_image_timeout_s)


@dataclass(frozen=True)
class DecodedVideo:
    """A video as the front keeps it: its identity, sampling and 64 px thumbnails of its
    frames (what the near-duplicate tier verifies), not the frames (a minute of frames is
    hundreds of MB; the thumbnails' background job holds them until it is done)."""

    content_hash: str
    signature: VideoSignature
    thumbs: FrameThumbs
    width: int
    height: int
    duration_s: float
    data_url: str | None = None  # a fetched remote video, as vLLM will get it

    @property
    def frames(self) -> int:
        return self.signature.frames


@dataclass(frozen=True)
class LoadedVideo:
    """A decoded video with its sampled frames and their metadata: what the Python API
    hands vLLM (the front forwards the encoded clip instead and keeps no frames)."""

    video: DecodedVideo
    frames: np.ndarray  # (T, H, W, 3) uint8, as vLLM's loader sampled them
    metadata: dict[str, Any]


class DecodedVideos:
    """Video URLs already decoded: the same encoded bytes are decoded once (an LRU bounded
    by its thumbnails' bytes, keyed by the URL text's BLAKE3 and the sampling kwargs;
    remote URLs never)."""

    def __init__(self, max_bytes: int = 64 * 1024**2) -> None:
        self.max_bytes = max_bytes
        self._items: OrderedDict[bytes, DecodedVideo] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, url: object, field: str, limits: VideoLimits, sampling: VideoSampling,
            runtime: Mapping[str, Any] | None, processor_kwargs: Mapping[str, Any] | None,
            thumbs: bool = True) -> DecodedVideo:
        """The decoded video behind ``url`` (from memory when seen before); ``thumbs``:
        with its frames' thumbnails (only the near-duplicate tier needs them: ~0.6 ms a
        frame)."""
        if not isinstance(url, str) or not url:
            raise RequestError(f"{field}: expected a video URL string")
        kwargs = video_kwargs(sampling, runtime)
        key = blake3(url.encode("latin-1", "replace")).digest() + json.dumps(
            [kwargs, dict(processor_kwargs or {}), repr(limits), thumbs], sort_keys=True,
            default=str).encode()
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit
        video = decode_video_url(url, field, limits, sampling, kwargs, processor_kwargs,
                                 thumbs)
        if url.startswith("data:") and _cost(video) <= self.max_bytes:
            with self._lock:
                if key not in self._items:
                    self._items[key] = video
                    self._bytes += _cost(video)
                while self._bytes > self.max_bytes:
                    self._bytes -= _cost(self._items.popitem(last=False)[1])
        return video


def _cost(video: DecodedVideo) -> int:
    """What a memoized video costs: its thumbnails and a kilobyte for the rest."""
    return int(video.thumbs.nbytes) + 1024


def decode_video_url(url: str, field: str, limits: VideoLimits, sampling: VideoSampling,
                     kwargs: Mapping[str, Any], processor_kwargs: Mapping[str, Any] | None,
                     thumbs: bool = True) -> DecodedVideo:
    """Decode and identify one video URL, or raise :class:`RequestError` naming ``field``."""
    data_url = None
    if url.startswith("data:"):
        data = data_url_bytes(url, field, limits.max_bytes)
    elif url.startswith(("http://", "https://")):
        if limits.remote != "fetch":
            raise RequestError(f"{field}: remote video URLs are not accepted by this server; "
                               "send the video as a data URL (data:video/mp4;base64,...)")
        data = fetch_image_bytes(url, field, ImageLimits(
            limits.max_bytes, limits.max_pixels, limits.remote, limits.timeout_s), "video")
        data_url = video_data_url(data)
    else:
        raise RequestError(f"{field}: unsupported video URL scheme (use a data: URL)")
    video = load_video_bytes(data, field, limits, sampling, kwargs, processor_kwargs,
                             thumbs, keep=True).video
    return dataclasses.replace(video, data_url=data_url)


def load_video_bytes(data: bytes, field: str, limits: VideoLimits, sampling: VideoSampling,
                     kwargs: Mapping[str, Any], processor_kwargs: Mapping[str, Any] | None,
                     thumbs: bool = True, keep: bool = False) -> LoadedVideo:
    """Decode an encoded clip within ``limits`` as the engine samples it: its identity and
    the frames themselves, or :class:`RequestError` naming ``field`` (``thumbs``: with the
    frames' thumbnails, which only the near-duplicate tier needs; ``keep``: the engine's
    loader in this process takes this decode instead of decoding the bytes again)."""
    from vlmcache.keys import video_content_hash

    if len(data) > limits.max_bytes:
        raise MediaTooLarge(f"{field}: the video is larger than the {limits.max_bytes}-byte "
                            "limit (max_video_bytes)")
    check_container(data, field, limits)
    try:
        frames, metadata = load_video(data, sampling, kwargs, keep)
    except Exception as exc:  # vLLM raises ValueError, cv2.error, RuntimeError, ...
        raise RequestError(f"{field}: cannot decode the video "
                           f"({type(exc).__name__}: {str(exc)[:200]})") from None
    shape = getattr(frames, "shape", ())
    if len(shape) != 4 or shape[0] < 1:
        raise RequestError(f"{field}: the video has no decodable frames")
    _check_decoded(field, limits, int(shape[0]), int(shape[2]), int(shape[1]))
    signature = VideoSignature(int(shape[0]), tuple(int(i) for i in metadata.get(
        "frames_indices") or range(int(shape[0]))), float(metadata.get("fps") or 0.0))
    # the thumbnails start on the background threads at once (a lookup makes the few it
    # needs itself): they overlap the hash and the rest of the request's path
    made = FrameThumbs.from_frames(frames) if thumbs else FrameThumbs.ready(_NO_THUMBS)
    video = DecodedVideo(video_content_hash(frames, metadata, processor_kwargs), signature,
                         made,
                         int(shape[2]), int(shape[1]), float(metadata.get("duration") or 0.0))
    return LoadedVideo(video, frames, metadata)


def video_data_url(data: bytes) -> str:
    """A base64 data URL carrying an encoded clip (its container is read from the bytes,
    so the MIME type only says "video")."""
    return "data:video/mp4;base64," + b64encode(data)


def _check_decoded(field: str, limits: VideoLimits, frames: int, width: int,
                   height: int) -> None:
    if frames > limits.max_frames:
        raise MediaTooLarge(f"{field}: the model's sampling takes {frames} frames, more "
                            f"than the {limits.max_frames}-frame limit (max_video_frames)")
    if width * height > limits.max_pixels:
        raise MediaTooLarge(f"{field}: frames are {width}x{height}, more than the "
                            f"{limits.max_pixels}-pixel limit (max_video_pixels)")


def check_container(data: bytes, field: str, limits: VideoLimits) -> None:
    """Refuse a video whose container states frames too large or a duration too long,
    before any frame is decoded (a decompression bomb costs nothing to send)."""
    try:
        probed = probe_video(data)
    except Exception as exc:  # cv2.error, ValueError
        raise RequestError(f"{field}: cannot decode the video ({str(exc)[:200]})") from None
    if probed is None:  # no OpenCV: the limits are checked on the decoded frames
        return
    width, height, count, fps = probed
    if width * height > limits.max_pixels:
        raise MediaTooLarge(f"{field}: frames are {width}x{height}, more than the "
                            f"{limits.max_pixels}-pixel limit (max_video_pixels)")
    duration = count / fps if fps > 0 and count > 0 else 0.0
    if duration > limits.max_duration_s:
        raise MediaTooLarge(f"{field}: the video lasts {duration:.1f} s, longer than the "
                            f"{limits.max_duration_s:g} s limit (max_video_duration_s)")


def data_url_bytes(url: str, field: str, max_bytes: int) -> bytes:
    """The clip a base64 data URL carries, or :class:`RequestError` naming ``field``."""
    if url.partition(",")[0].lower().startswith("data:video/jpeg"):
        raise RequestError(f"{field}: video/jpeg frame lists are not accepted by the front; "
                           "send the frames as image parts or the clip as a video file")
    return base64_data_url(url, field, max_bytes, "video", MediaTooLarge(
        f"{field}: the video is larger than the {max_bytes}-byte limit (max_video_bytes)"))
