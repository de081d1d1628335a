"""Media of :class:`~vlmcache.api.CachedLLM` requests: placeholders, checks, video decoding.

One front serves every entry point, so a video given to ``CachedLLM.generate`` (its encoded
bytes) is treated as the serving front treats a ``video_url`` part: decoded once with vLLM's
own loader and the sampling the engine uses (the ``media_io_kwargs`` of its engine args and
the model's video processor), checked against the same ``max_video_*`` limits, and named by
its sampled frames (:func:`~vlmcache.keys.video_content_hash`). The decoding and the limits
are the front's (:mod:`vlmcache.serving.videos`); this module only adapts them to bytes.

How vLLM's offline API takes a video (vLLM 0.32, ``vllm/multimodal/parse.py``): a prompt's
``multi_modal_data["video"]`` holds one ``(frames, metadata)`` tuple per video (``frames`` a
``(T, H, W, 3)`` uint8 array), the same pair its chat path builds from a ``video_url``.
Models whose parser wants the metadata (Qwen2.5-VL, Qwen3-VL, GLM-4.1V: ``video_needs_metadata``)
read the sampled frame indices and fps from it; LLaVA-NeXT-Video and Qwen2-VL drop it and
take the frames. ``multi_modal_uuids["video"]`` gives each video its identity in vLLM's
caches, as a ``uuid`` on a chat part does. The frames are sent already decoded, so the
engine decodes nothing again.
"""

from __future__ import annotations

import functools
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from vlmcache.cascade import Resolution
from vlmcache.config import VlmCacheConfig
from vlmcache.errors import RequestError
from vlmcache.serving.videos import (VideoLimits, data_url_bytes, load_video_bytes,
                                     video_data_url)
from vlmcache.tiers.video import VideoQuery
from vlmcache.vllm.video_io import VideoSampling, video_kwargs, video_processor_name

logger = logging.getLogger(__name__)

DEFAULT_IMAGE_PLACEHOLDER = "<image>"
DEFAULT_VIDEO_PLACEHOLDER = "<video>"
#: config.json keys naming the token id of each medium's placeholder (LLaVA, Qwen2-VL, ...)
IMAGE_TOKEN_KEYS = ("image_token_index", "image_token_id")
VIDEO_TOKEN_KEYS = ("video_token_index", "video_token_id")


def model_placeholder(model: str, keys: Sequence[str], default: str) -> str:
    """The text of the model's placeholder token: the first of ``keys`` in ``config.json``
    gives its id, the tokenizer's added tokens its content (``tokenizer_config.json``'s
    ``added_tokens_decoder``, else ``tokenizer.json``'s ``added_tokens``); ``default``
    when the files do not say."""
    root = Path(model)
    try:
        cfg = json.loads((root / "config.json").read_text())
        token_id = next((cfg[k] for k in keys if isinstance(cfg.get(k), int)), None)
    except (OSError, ValueError, AttributeError):
        return default
    if token_id is None:
        return default
    return _added_token(root, token_id) or default


def _added_token(root: Path, token_id: int) -> str | None:
    try:
        tok = json.loads((root / "tokenizer_config.json").read_text())
        content = tok.get("added_tokens_decoder", {}).get(str(token_id), {}).get("content")
        if isinstance(content, str) and content:
            return content
    except (OSError, ValueError, AttributeError):
        pass
    try:  # transformers 5 keeps the added tokens in tokenizer.json only
        added = json.loads((root / "tokenizer.json").read_text()).get("added_tokens", [])
        found = [t.get("content") for t in added if t.get("id") == token_id]
    except (OSError, ValueError, AttributeError):
        return None
    return found[0] if found and isinstance(found[0], str) and found[0] else None


def check_images(images: object, index: int) -> None:
    """:class:`RequestError` naming the request unless ``images`` is a tuple of non-empty
    PIL images."""
    from PIL import Image

    if not isinstance(images, (tuple, list)):
        raise RequestError(f"request {index}: images must be a tuple of PIL images")
    for j, image in enumerate(images):
        if not isinstance(image, Image.Image):
            raise RequestError(f"request {index}: image {j} is a {type(image).__name__}, "
                               "expected a PIL.Image.Image")
        if image.width < 1 or image.height < 1:
            raise RequestError(f"request {index}: image {j} is empty ({image.size})")


def check_videos(videos: object, index: int, prompt: str, placeholder: str | None,
                 max_videos: int) -> tuple[bytes, ...]:
    """A request's videos as a tuple of encoded clips, or :class:`RequestError` naming the
    request and the problem (``placeholder``: the model's; ``None``: not counted)."""
    if not isinstance(videos, (tuple, list)):
        raise RequestError(f"request {index}: videos must be a tuple of encoded clips (bytes)")
    for j, clip in enumerate(videos):
        if not isinstance(clip, (bytes, bytearray, memoryview)):
            raise RequestError(f"request {index}: video {j} is a {type(clip).__name__}, "
                               "expected the clip's encoded bytes (e.g. an MP4 file's)")
        if not len(clip):
            raise RequestError(f"request {index}: video {j} is empty (0 bytes)")
    if len(videos) > max_videos:
        raise RequestError(f"request {index}: {len(videos)} videos, more than the "
                           f"{max_videos} allowed per request (max_videos_per_request)")
    if placeholder is not None and prompt.count(placeholder) != len(videos):
        raise RequestError(f"request {index}: prompt has {prompt.count(placeholder)} video "
                           f"placeholder(s) {placeholder!r} but {len(videos)} video(s) were "
                           "given: each video needs one placeholder")
    return tuple(bytes(clip) for clip in videos)


@dataclass(frozen=True)
class ApiVideo:
    """One decoded video of a request: what the tiers see (identity, sampling, thumbnails,
    the clip as a data URL when the near-duplicate tier may keep it) and what vLLM gets."""

    query: VideoQuery
    frames: np.ndarray  # (T, H, W, 3) uint8, as vLLM's loader sampled them
    metadata: dict[str, Any]

    @property
    def content_hash(self) -> str:
        return self.query.content_hash

    @property
    def frame_count(self) -> int:
        return self.query.signature.frames

    def engine_item(self) -> tuple[np.ndarray, dict[str, Any]]:
        """The ``multi_modal_data["video"]`` entry vLLM's offline API takes."""
        return self.frames, self.metadata


class VideoDecoder:
    """Decodes a ``CachedLLM``'s videos as its engine samples them.

    Args:
        model: the model directory (its video processor picks vLLM's loader backend).
        config: the limits (``max_video_*``); remote URLs never apply (clips come as bytes).
        media_io_kwargs: the engine's ``media_io_kwargs`` (``None``: vLLM's defaults).
    """

    def __init__(self, model: str, config: VlmCacheConfig,
                 media_io_kwargs: Mapping[str, Mapping[str, Any]] | None) -> None:
        self.model = model
        self.limits = VideoLimits.from_config(config)
        self.media_io_kwargs = dict(media_io_kwargs or {})
        self.thumbs = config.enable_video_near_duplicates  # only that tier reads them

    @functools.cached_property
    def sampling(self) -> VideoSampling:
        # resolved at the first video: it reads the model's processor files through vLLM
        return VideoSampling(self.media_io_kwargs, video_processor_name(self.model))

    @functools.cached_property
    def kwargs(self) -> dict[str, Any]:
        return video_kwargs(self.sampling, None)

    def decode(self, data: bytes, field: str, keep_url: bool) -> ApiVideo:
        """Decode one clip (``keep_url``: carry it as a data URL, which the near-duplicate
        tier keeps to send it again); :class:`RequestError` naming ``field``.

        No processor kwargs go into the identity: the same clip gets the same name here as
        through the serving front (engine-wide processor kwargs are hashed in by vLLM)."""
        loaded = load_video_bytes(data, field, self.limits, self.sampling, self.kwargs, None,
                                  self.thumbs)
        video = loaded.video
        query = VideoQuery(video.content_hash, video.signature, video.thumbs,
                           video_data_url(data) if keep_url else "")
        return ApiVideo(query, loaded.frames, loaded.metadata)

    def canonical(self, videos: Sequence[ApiVideo],
                  res: Resolution) -> tuple[ApiVideo, ...] | None:
        """The videos to send after the cascade: each one the near-duplicate tier matched
        replaced by its canonical clip, decoded from the data URL the tier kept. ``None``
        when a canonical clip no longer decodes to the identity it was stored under (then
        the request must be resolved without the tier, or it would be sent under a name
        its frames do not have)."""
        urls = res.video_urls or (None,) * len(videos)
        out = []
        for k, (video, url) in enumerate(zip(videos, urls)):
            if url is None:
                out.append(video)
                continue
            try:
                clip = data_url_bytes(url, f"canonical video {k}", self.limits.max_bytes)
                found = self.decode(clip, f"canonical video {k}", keep_url=False)
            except RequestError as exc:
                logger.warning("api: canonical clip of video %d does not decode: %s", k, exc)
                return None
            if found.content_hash != res.video_hashes[k]:
                logger.warning("api: canonical clip of video %d decodes to another identity "
                               "(%s, not %s)", k, found.content_hash[:16],
                               res.video_hashes[k][:16])
                return None
            out.append(found)
        return tuple(out)
