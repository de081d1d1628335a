"""Fast tests (no vLLM) for vlmcache.testing.tiny_llava.

Run: cd /work/main && PYTHONPATH=src python -m pytest tests/testing -q
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("tokenizers")
pytest.importorskip("safetensors")
transformers = pytest.importorskip("transformers")

from vlmcache.testing import tiny_llava as tl  # noqa: E402
from vlmcache.testing.tiny_llava import (  # noqa: E402
    BUILD_INFO_FILE,
    EXAMPLE_QUESTIONS,
    IMAGE_TOKEN,
    TINY_LLAVA_PROMPT,
    build_tiny_llava,
    image_token_count,
    make_test_image,
)

EXPECTED_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "processor_config.json",
    "chat_template.jinja",
    BUILD_INFO_FILE,
}


def _file_hashes(d: Path) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(d.iterdir())
        if p.is_file()
    }


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("tiny_llava") / "model")


# ------------------------------------------------------------------------------------
# build output and determinism


def test_layout(model_dir: Path):
    names = {p.name for p in model_dir.iterdir()}
    assert EXPECTED_FILES <= names, EXPECTED_FILES - names
    info = json.loads((model_dir / BUILD_INFO_FILE).read_text())
    assert info["params"]["seed"] == 0
    assert info["image_tokens_per_image"] == 256 == image_token_count(224, 14)
    assert set(info["files"]) == EXPECTED_FILES - {BUILD_INFO_FILE}


def test_two_builds_byte_identical(model_dir: Path, tmp_path: Path):
    other = build_tiny_llava(tmp_path / "again")
    assert _file_hashes(other) == _file_hashes(model_dir)
    assert (other / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()


def test_seed_changes_weights_only(model_dir: Path, tmp_path: Path):
    other = build_tiny_llava(tmp_path / "seed1", seed=1)
    a, b = _file_hashes(model_dir), _file_hashes(other)
    assert a["model.safetensors"] != b["model.safetensors"]
    for name in ("tokenizer.json", "config.json", "processor_config.json"):
        assert a[name] == b[name], name


def test_weight_names_are_vllm_llava_layout(model_dir: Path):
    from safetensors import safe_open

    with safe_open(str(model_dir / "model.safetensors"), "pt") as f:
        keys = set(f.keys())
        meta = f.metadata()
    assert meta == {"format": "pt"}
    assert "vision_tower.vision_model.embeddings.patch_embedding.weight" in keys
    assert "vision_tower.vision_model.encoder.layers.0.self_attn.q_proj.weight" in keys
    assert "language_model.model.embed_tokens.weight" in keys
    assert "language_model.model.layers.1.self_attn.k_proj.weight" in keys
    assert "language_model.lm_head.weight" in keys
    assert "multi_modal_projector.linear_2.weight" in keys
    prefixes = ("vision_tower.vision_model.", "language_model.model.",
                "language_model.lm_head.", "multi_modal_projector.")
    assert all(k.startswith(prefixes) for k in keys), sorted(k for k in keys if not k.startswith(prefixes))


# ------------------------------------------------------------------------------------
# cache short-circuit


def test_cache_short_circuit(model_dir: Path, monkeypatch):
    before = {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()}

    def boom(*a, **k):
        raise AssertionError("rebuilt although a complete build with the same params exists")

    monkeypatch.setattr(tl, "_build_into", boom)
    assert build_tiny_llava(model_dir) == model_dir
    after = {p.name: p.stat().st_mtime_ns for p in model_dir.iterdir()}
    assert after == before


def test_cache_rebuilds_on_param_change_or_damage(tmp_path: Path, monkeypatch):
    d = build_tiny_llava(tmp_path / "m")
    good = _file_hashes(d)
    calls = []
    real = tl._build_into
    monkeypatch.setattr(tl, "_build_into", lambda *a, **k: (calls.append(1), real(*a, **k)))

    # damaged weights file -> rebuilt, identical again
    (d / "model.safetensors").write_bytes(b"garbage")
    build_tiny_llava(d)
    assert len(calls) == 1
    assert _file_hashes(d) == good

    # missing build record -> rebuilt
    (d / BUILD_INFO_FILE).unlink()
    build_tiny_llava(d)
    assert len(calls) == 2
    assert _file_hashes(d) == good

    # different params -> rebuilt with those params
    build_tiny_llava(d, seed=7)
    assert len(calls) == 3
    assert json.loads((d / BUILD_INFO_FILE).read_text())["params"]["seed"] == 7
    assert _file_hashes(d)["model.safetensors"] != good["model.safetensors"]


# ------------------------------------------------------------------------------------
# loading with transformers


def test_auto_classes_load(model_dir: Path):
    from transformers import AutoConfig, AutoProcessor, AutoTokenizer

    cfg = AutoConfig.from_pretrained(model_dir)
    assert cfg.model_type == "llava"
    assert cfg.vision_config.model_type == "clip_vision_model"
    assert cfg.text_config.model_type == "llama"
    assert cfg.vision_config.image_size == 224 and cfg.vision_config.patch_size == 14
    head_dim = cfg.text_config.hidden_size // cfg.text_config.num_attention_heads
    assert head_dim in (32, 64, 128)  # accepted by vLLM's CPU attention backend

    tok = AutoTokenizer.from_pretrained(model_dir)
    assert 256 < len(tok) <= 1024
    assert tok.pad_token is not None and tok.pad_token_id != tok.eos_token_id

    proc = AutoProcessor.from_pretrained(model_dir)
    assert type(proc).__name__ == "LlavaProcessor"
    assert proc.image_token == IMAGE_TOKEN


def test_image_token(model_dir: Path):
    from transformers import AutoConfig, AutoTokenizer

    cfg = AutoConfig.from_pretrained(model_dir)
    tok = AutoTokenizer.from_pretrained(model_dir)
    image_id = tok.convert_tokens_to_ids(IMAGE_TOKEN)
    assert image_id == cfg.image_token_index
    assert image_id != tok.unk_token_id
    # One token, never split, with or without surrounding text.
    assert tok.encode(IMAGE_TOKEN, add_special_tokens=False) == [image_id]
    ids = tok.encode(TINY_LLAVA_PROMPT.format(question="What is this?"))
    assert ids[0] == tok.bos_token_id
    assert ids.count(image_id) == 1


def test_prompt_lengths_with_processor(model_dir: Path):
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(model_dir)
    image_id = proc.tokenizer.convert_tokens_to_ids(IMAGE_TOKEN)
    for i, q in enumerate(EXAMPLE_QUESTIONS):
        assert 28 <= len(q.split()) <= 34
        out = proc(text=TINY_LLAVA_PROMPT.format(question=q), images=make_test_image(i),
                   return_tensors="pt")
        ids = out["input_ids"][0].tolist()
        assert ids.count(image_id) == 256
        assert len(ids) > 320  # >= 10 full blocks of 32
        assert tuple(out["pixel_values"].shape) == (1, 3, 224, 224)


def test_chat_template_renders_prompt_format(model_dir: Path):
    from transformers import AutoProcessor

    proc = AutoProcessor.from_pretrained(model_dir)
    q = "What colour is the circle?"
    msgs = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}]
    text = proc.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert text == TINY_LLAVA_PROMPT.format(question=q)


def test_llava_model_loads_with_all_weights(model_dir: Path):
    import torch
    from safetensors.torch import load_file
    from transformers import LlavaForConditionalGeneration

    model, info = LlavaForConditionalGeneration.from_pretrained(model_dir, output_loading_info=True)
    assert not any(info.values()), info
    saved = load_file(str(model_dir / "model.safetensors"))
    state = model.state_dict()
    assert len(state) == len(saved)
    for name, t in state.items():
        assert torch.equal(t, saved[tl._to_llava_hf_name(name)]), name


def test_images_change_greedy_output(model_dir: Path):
    """The image must matter: a cache serving the wrong image's KV has to be detectable."""
    import torch
    from transformers import AutoProcessor, LlavaForConditionalGeneration

    proc = AutoProcessor.from_pretrained(model_dir)
    model = LlavaForConditionalGeneration.from_pretrained(model_dir, dtype=torch.float32).eval()
    prompt = TINY_LLAVA_PROMPT.format(question=EXAMPLE_QUESTIONS[0])
    outs = []
    for seed in (0, 1, 0):
        inputs = proc(text=prompt, images=make_test_image(seed), return_tensors="pt")
        with torch.no_grad():
            g = model.generate(**inputs, max_new_tokens=6, do_sample=False)
        outs.append(g[0, inputs["input_ids"].shape[1]:].tolist())
    assert outs[0] == outs[2]
    assert outs[0] != outs[1]


# ------------------------------------------------------------------------------------
# images


def test_make_test_image_deterministic_and_distinct():
    a, b, c = make_test_image(0), make_test_image(0), make_test_image(1)
    assert a.size == (224, 224) and a.mode == "RGB"
    assert a.tobytes() == b.tobytes()
    assert a.tobytes() != c.tobytes()
    assert len({make_test_image(s).tobytes() for s in range(8)}) == 8
    assert make_test_image(3, size=(64, 48)).size == (64, 48)


def test_build_rejects_bad_params(tmp_path: Path):
    with pytest.raises(ValueError):
        build_tiny_llava(tmp_path / "x", image_size=100, patch_size=14)
    with pytest.raises(ValueError):
        build_tiny_llava(tmp_path / "x", text_hidden=130, text_heads=4)
    assert not (tmp_path / "x").exists()


def test_no_stray_temp_files(model_dir: Path):
    leftovers = [p.name for p in model_dir.iterdir() if p.name.startswith(".")]
    assert leftovers == []
    # Files get the umask's default mode (some writers use mkstemp, i.e. 0600).
    for p in model_dir.iterdir():
        assert os.stat(p).st_mode & 0o777 == tl._default_file_mode(), p.name
