"""vLLM's own video decoding, as the front calls it: the frames the engine will see.

vLLM's chat path decodes a ``video_url`` with ``VideoMediaIO`` (OpenCV by default), the
deployment's ``--media-io-kwargs`` (merged with a request's ``media_io_kwargs``) and the
loader backend the model's video processor registers (Qwen3-VL samples by fps, others
uniformly). The front names a video by those frames, so it must decode exactly as vLLM
does: this module calls the same classes. Only translation lives here; the limits and
identity live in :mod:`vlmcache.serving.videos`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Mapping


@dataclass(frozen=True)
class VideoSampling:
    """How the engine samples a video: the server's ``--media-io-kwargs`` (``video`` and
    ``image`` entries) and the model's video processor class name (which picks vLLM's
    loader backend), e.g. ``VideoSampling({"video": {"num_frames": 8}}, None)``."""

    media_io_kwargs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    video_processor: str | None = None


def _video_io_module() -> Any:
    try:  # vLLM 0.32
        from vllm.multimodal.media import video as module
    except ImportError:  # vLLM 0.26 kept the media IO classes beside the loaders
        from vllm.multimodal import video as module  # type: ignore[no-redef]
    return module


def _image_io_class() -> Any:
    try:
        from vllm.multimodal.media.image import ImageMediaIO
    except ImportError:
        from vllm.multimodal.image import ImageMediaIO  # type: ignore[no-redef]
    return ImageMediaIO


def video_kwargs(sampling: VideoSampling, runtime: Mapping[str, Any] | None) -> dict[str, Any]:
    """The ``VideoMediaIO`` kwargs for one request, merged as vLLM merges them (a request's
    ``num_frames`` drops the server's ``fps`` and the reverse)."""
    default = dict(sampling.media_io_kwargs.get("video", {}))
    io_cls = _video_io_module().VideoMediaIO
    merge = getattr(io_cls, "merge_kwargs", None)
    merged = merge(default, dict(runtime)) if merge and runtime else {**default, **(runtime or {})}
    if "video_backend" not in merged and sampling.video_processor:
        backend = _backend_for(sampling.video_processor)
        if backend:
            merged["video_backend"] = backend
    return merged


def _backend_for(video_processor: str) -> str | None:
    try:
        from vllm.multimodal.video import get_video_loader_backend_for_processor
    except ImportError:  # older vLLM: one loader for every model
        return None
    return get_video_loader_backend_for_processor(video_processor)


def load_video(data: bytes, sampling: VideoSampling, kwargs: Mapping[str, Any],
               keep: bool = False) -> tuple[Any, dict[str, Any]]:
    """``(frames, metadata)`` of a video's bytes, decoded by vLLM's loader: ``frames`` a
    ``(T, H, W, 3)`` uint8 array of the sampled frames, ``metadata`` what the model's
    processor gets (fps, frame indices, duration, ...). Raises what vLLM raises.

    ``keep``: hand the decode to vLLM's loader in this process (:mod:`.video_handoff`, when
    installed), which would decode the same bytes again."""
    from contextlib import nullcontext

    from vlmcache.vllm import video_handoff

    module = _video_io_module()
    image_kwargs = {"image_mode": "RGB", **dict(sampling.media_io_kwargs.get("image", {}))}
    io = module.VideoMediaIO(_image_io_class()(**image_kwargs), **dict(kwargs))
    with video_handoff.keeping() if keep else nullcontext():
        loaded = io.load_bytes(data)
    frames, metadata = getattr(loaded, "media", loaded)
    return frames, dict(metadata)


@functools.lru_cache(maxsize=8)
def video_processor_name(model: str) -> str | None:
    """The model's HF video processor class name, as vLLM resolves it (``None``: none)."""
    try:
        from vllm.transformers_utils.processor import (
            get_video_processor_cls_name_from_config)
    except ImportError:
        return None
    try:
        return get_video_processor_cls_name_from_config(model)
    except Exception:  # a model without processor files: vLLM's default loader then
        return None


def probe_video(data: bytes) -> tuple[int, int, float, float] | None:
    """``(width, height, frame count, fps)`` a video's container states, read without
    decoding a frame, through the OpenCV stream API vLLM's loader opens; ``None`` when
    OpenCV is not installed. Raises ``ValueError`` when OpenCV cannot open the bytes."""
    try:
        import io

        import cv2
    except ImportError:
        return None
    stream = io.BytesIO(data)  # held while the capture reads it
    cap = cv2.VideoCapture(stream, _stream_api(cv2), [])
    try:
        if not cap.isOpened():
            raise ValueError("not a video OpenCV reads")
        return (int(cap.get(cv2.CAP_PROP_FRAME_WIDTH)), int(cap.get(cv2.CAP_PROP_FRAME_HEIGHT)),
                float(cap.get(cv2.CAP_PROP_FRAME_COUNT)), float(cap.get(cv2.CAP_PROP_FPS)))
    finally:
        cap.release()


def _stream_api(cv2: Any) -> int:
    """The OpenCV backend vLLM's loader reads a byte stream with (``CAP_ANY`` cannot read a
    stream): vLLM 0.32 keeps the choice in ``video_decoders.opencv``, 0.26 in ``video``."""
    import importlib

    for path in ("vllm.multimodal.video_decoders.opencv", "vllm.multimodal.video"):
        try:
            mixin = importlib.import_module(path).OpenCVVideoBackendMixin
        except (ImportError, AttributeError):
            continue
        api = mixin.get_cv2_video_api()
        return cv2.CAP_ANY if api is None else int(api)
    return int(cv2.CAP_ANY)


#: Model types whose vision encoder mixes frames: Qwen2-VL and its successors merge two
#: frames per temporal patch and attend across the clip; GLM-4V likewise. Per-frame reuse
#: would change their answers: they reuse per clip only.
_MIXES_FRAMES = frozenset({"qwen2_vl", "qwen2_5_vl", "qwen3_vl", "qwen3_vl_moe", "glm4v",
                           "glm4v_moe", "keye_vl"})
#: Model types whose encoder sees each frame alone (CLIP / SigLIP per frame, then pooling).
_FRAMES_APART = frozenset({"llava_next_video", "llava_onevision", "llava", "llava_next",
                           "internvl_chat", "internvl"})


@functools.lru_cache(maxsize=8)
def encoder_mixes_frames(model: str) -> bool | None:
    """Whether the model's vision encoder mixes a video's frames (``None``: not known).

    Either way vLLM encodes a video as one item, so its encoder output and KV are reused
    per clip; where frames are encoded apart, a stream sent as images reuses each frame
    (``docs/video.md``)."""
    import json
    from pathlib import Path

    try:
        model_type = json.loads((Path(model) / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    if model_type in _MIXES_FRAMES:
        return True
    return False if model_type in _FRAMES_APART else None
