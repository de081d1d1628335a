"""Fidelity of the similarity tiers: do canonicalized requests still get the right answer?

On the trained easy-vqa model (tiny-vqa), one engine: seed requests are asked first (they
become canonical), then probes (paraphrases, near-duplicate frames, moving-shape videos,
negated and recoloured questions, other images) with the tiers on and with them off
(``bypass``). Per category and per tier: hit rate, false hits (a hit whose canonical
request has another ground-truth answer), accuracy against easy-vqa's ground truth,
agreement with the cache-off answer, latency; plus hit rate and accuracy against the
threshold (0.70-0.99), with and without the paraphrase gate, as a table, JSON and PNG.

The sweep is computed from the tiers' best-candidate scores (text: best of the prompt and
question layers) taken before the probes run:
a hit at threshold t returns the canonical request's answer (exact caching below the
rewrite), a miss the probe's own cache-off answer.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shlex
import statistics
import sys
import tempfile
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from vlmcache.bench.fidelity_data import (
    Probe,
    ShapeAttrs,
    answer,
    image_attrs,
    near_duplicates,
    negate,
    recolour,
    video,
)
from vlmcache.bench.fidelity_report import gate_cost, plot, table

logger = logging.getLogger(__name__)

THRESHOLDS = tuple(round(t, 2) for t in np.arange(0.70, 0.991, 0.01))
TEXT_CATEGORIES = ("paraphrase", "negated", "recoloured")
#: Rewrites count as hits; "kv" (a stored prefix, e.g. the image tokens alone) does not.
REWRITE_TIERS = ("text:exact", "embedding:vision", "embedding:prompt", "semantic_text")
TIER_CATEGORIES = {"embedding:vision": ("near_dup:shifted", "near_dup:noised", "near_dup:jpeg",
                                        "video", "other_image"),
                   "semantic_text": TEXT_CATEGORIES}


@dataclass
class Row:
    """One probe's outcome."""

    probe: Probe
    on: str = ""
    off: str = ""
    hit_tier: str | None = None
    canonical_gt: str | None = None
    latency_on: float = 0.0
    latency_off: float = 0.0
    scores: dict[str, float] = field(default_factory=dict)  # sweep: best candidate scores
    sweep_answer: str = ""  # what a hit returns (the canonical request's answer)
    sweep_gt: str | None = None  # the true answer of that canonical request
    sweep_key: str = ""  # the canonical image's store key
    gated: bool = False  # the best text candidate is refused by the gate


def build_probes(n_images: int, seed: int) -> tuple[list[Probe], list[Probe]]:
    """(seed requests, probes) on the first ``n_images`` usable easy-vqa test images."""
    import easy_vqa
    from PIL import Image

    from vlmcache.models.paraphrases import paraphrase

    rng = np.random.default_rng(seed)
    qs, ans, ids = easy_vqa.get_test_questions()
    attrs = image_attrs(qs, ans, ids)
    paths = easy_vqa.get_test_image_paths()
    by_image: dict[int, list[str]] = defaultdict(list)
    for q, i in zip(qs, ids):
        by_image[i].append(q)
    chosen = sorted(attrs)[:n_images]
    seeds, probes = [], []
    for i in chosen:
        image, a = Image.open(paths[i]).convert("RGB"), attrs[i]
        q = by_image[i][int(rng.integers(len(by_image[i])))]
        seeds.append(Probe("seed", image, q, a, f"vqa{i}", False))
        probes.append(Probe("paraphrase", image, paraphrase(q, int(rng.integers(2))), a,
                            f"vqa{i}", True, meaning=q))
        for name, im in near_duplicates(image, rng).items():
            probes.append(Probe(name, im, q, a, f"vqa{i}:{name}", True))
        for name, q2 in (("negated", negate(q)), ("recoloured", recolour(q, rng))):
            if q2 is not None:
                probes.append(Probe(name, image, q2, a, f"vqa{i}", False))
        other = chosen[(chosen.index(i) + 1) % len(chosen)]
        probes.append(Probe("other_image", Image.open(paths[other]).convert("RGB"), q,
                            attrs[other], f"vqa{other}", False))
    seeds_v, probes_v = _videos(attrs, chosen, rng)
    return seeds + seeds_v, probes + probes_v


def _videos(attrs, chosen, rng) -> tuple[list[Probe], list[Probe]]:
    seeds, probes = [], []
    for k, i in enumerate(chosen[: max(1, len(chosen) // 4)]):
        a = attrs[i]
        q = ("what shape is in the image?", "what color is the shape?")[k % 2]
        frames = video(a, 6, rng)
        seeds.append(Probe("seed", frames[0], q, a, f"video{k}:0", False))
        probes += [Probe("video", f, q, a, f"video{k}:{j}", True)
                   for j, f in enumerate(frames[1:], 1)]
    return seeds, probes


def _request(probe: Probe) -> Any:
    from vlmcache.api import VlmRequest
    from vlmcache.models.tiny_vqa import make_prompt

    return VlmRequest(make_prompt(probe.question), (probe.image,), None, probe.question)


def _ask(llm: Any, probe: Probe, params: Any, bypass: bool) -> tuple[str, Any]:
    from vlmcache.models.tiny_vqa import normalize_answer

    out = llm.generate([_request(probe)], params, bypass=bypass)[0]
    return normalize_answer(out.text), out


def score_probe(cascade: Any, probe: Probe, known: dict[str, ShapeAttrs],
                seed_on: dict[tuple[str, str], str]) -> Row:
    """Best-candidate scores of ``probe`` (no side effects) for the threshold sweep."""
    from vlmcache.keys import image_content_hash
    from vlmcache.models.tiny_vqa import make_prompt
    from vlmcache.tiers.gates import check_paraphrase
    from vlmcache.tiers.semantic_text import (
        PROMPT_LAYER,
        QUESTION_LAYER,
        TextQuery,
        image_context,
    )

    row, h = Row(probe), image_content_hash(probe.image)
    if probe.category in TEXT_CATEGORIES:
        text = cascade.text
        saved = (text.thresholds, text.gate)
        text.thresholds, text.gate = {k: -1.0 for k in text.thresholds}, False
        try:
            query = TextQuery(probe.question, make_prompt(probe.question),
                              image_context((h,)), None)
            match = text.lookup(query, (PROMPT_LAYER, QUESTION_LAYER)).match
        finally:
            text.thresholds, text.gate = saved
        if match is not None:
            row.scores["text"] = match.score
            row.gated = not check_paraphrase(probe.question, match.question).ok
            row.sweep_gt = answer(match.question, probe.attrs)  # a seed's template question
            row.sweep_answer = seed_on.get((h, match.question), "")
        return row
    vec = cascade.image.embedder.embed([probe.image], [h])[0]
    hits = cascade.image.index.search(vec, k=1, accept=lambda e: e.tenant is None)
    if hits:
        canon = hits[0].entry.context
        row.scores["image"], row.sweep_key = hits[0].score, hits[0].entry.key
        row.sweep_gt = answer(probe.question, known[canon])
        row.sweep_answer = seed_on.get((canon, probe.question), "")
    return row


def _fill_sweep_answers(llm: Any, rows: Sequence[Row], params: Any) -> None:
    """Where a sweep hit's answer was never asked (canonical image, probe question), ask."""
    from vlmcache.tiers.image_embedding import tensors_to_image

    for row in rows:
        if row.sweep_answer or row.scores.get("image", -1.0) < THRESHOLDS[0]:
            continue
        tensors = llm._cascade.image.store.get(row.sweep_key)
        if tensors is not None:
            canon = Probe("sweep", tensors_to_image(tensors), row.probe.question,
                          row.probe.attrs, "", False)
            row.sweep_answer, _ = _ask(llm, canon, params, bypass=True)


def run(llm: Any, seeds: Sequence[Probe], probes: Sequence[Probe], params: Any) -> list[Row]:
    """Seeds first (canonical), then each probe with the tiers on and off."""
    from vlmcache.keys import image_content_hash

    seed_on: dict[tuple[str, str], str] = {}
    known: dict[str, ShapeAttrs] = {}
    meaning = {p.question: p.template_question for p in probes}
    seed_rows = [Row(s) for s in seeds]
    for row in seed_rows:
        h = image_content_hash(row.probe.image)
        row.on, out = _ask(llm, row.probe, params, bypass=False)
        row.off, row.latency_on = row.on, out.report.latency_s
        row.hit_tier = out.report.hit_tier  # a seed can itself be a near-duplicate
        seed_on[(h, row.probe.question)], known[h] = row.on, row.probe.attrs
    llm._cascade.flush()
    rows = [score_probe(llm._cascade, p, known, seed_on) for p in probes]
    _fill_sweep_answers(llm, rows, params)
    for row in rows:
        row.on, out = _ask(llm, row.probe, params, bypass=False)
        row.hit_tier, row.latency_on = out.report.hit_tier, out.report.latency_s
        h, rw = image_content_hash(row.probe.image), out.rewrite
        canon_h = rw.canonical_images[0] if rw and rw.canonical_images else h
        canon_q = (rw.canonical_question if rw else None) or row.probe.question
        row.canonical_gt = answer(meaning.get(canon_q, canon_q),
                                  known.get(canon_h, row.probe.attrs))
        known.setdefault(h, row.probe.attrs)
    for row in rows:
        row.off, out = _ask(llm, row.probe, params, bypass=True)
        row.latency_off = out.report.latency_s
    return seed_rows + rows


def _hit(row: Row) -> bool:
    return row.hit_tier in REWRITE_TIERS


def _false_hit(row: Row) -> bool:
    """A hit on a canonical request whose true answer differs from the probe's."""
    return _hit(row) and row.canonical_gt != row.probe.gt


def summarize(rows: Sequence[Row]) -> dict[str, dict[str, Any]]:
    """Metrics per category, and per tier over the categories it serves."""
    groups: dict[str, list[Row]] = defaultdict(list)
    for row in rows:
        groups[row.probe.category].append(row)
    out = {f"category:{k}": _metrics(v) for k, v in sorted(groups.items())}
    for tier, cats in TIER_CATEGORIES.items():
        tier_rows = [r for r in rows if r.probe.category in cats]
        out[tier] = _metrics(tier_rows)
        positives = [r for r in tier_rows if r.probe.expect_hit]
        out[tier]["hit_rate"] = _mean([_hit(r) for r in positives])
        out[tier]["negatives_hit_rate"] = _mean(
            [_hit(r) for r in tier_rows if not r.probe.expect_hit])
    return out


def _metrics(rows: Sequence[Row]) -> dict[str, Any]:
    tiers: dict[str, int] = defaultdict(int)
    for r in rows:
        tiers[str(r.hit_tier)] += 1
    hits = [r for r in rows if _hit(r)]
    return {"n": len(rows), "hit_rate": _mean([_hit(r) for r in rows]),
            "false_hit_rate": _mean([_false_hit(r) for r in rows]),
            "accuracy": _mean([r.on == r.probe.gt for r in rows]),
            "accuracy_no_cache": _mean([r.off == r.probe.gt for r in rows]),
            "agreement_with_no_cache": _mean([r.on == r.off for r in rows]),
            "accuracy_of_hits": _mean([r.on == r.probe.gt for r in hits]),
            "accuracy_of_hits_no_cache": _mean([r.off == r.probe.gt for r in hits]),
            "latency_ms_median": _ms([r.latency_on for r in rows]),
            "latency_ms_median_no_cache": _ms([r.latency_off for r in rows]),
            "hit_tiers": dict(tiers)}


def _mean(values: Sequence[bool]) -> float | None:
    return round(sum(values) / len(values), 4) if values else None


def _ms(values: Sequence[float]) -> float | None:
    return round(statistics.median(values) * 1e3, 2) if values else None


def sweep(rows: Sequence[Row]) -> dict[str, list[dict[str, Any]]]:
    """Hit rate / false hits / accuracy against the threshold (gate on and off for text)."""
    curves: dict[str, list[dict[str, Any]]] = {}
    variants = (("embedding:vision", "image", False), ("semantic_text", "text", True),
                ("semantic_text:no_gate", "text", False))
    for name, key, gate in variants:
        cats = TIER_CATEGORIES[name.split(":no_gate")[0]]
        tier_rows = [r for r in rows if r.probe.category in cats]
        curve = []
        for t in THRESHOLDS:
            hit = [r.scores.get(key, -1.0) >= t and not (gate and r.gated) for r in tier_rows]
            answers = [r.sweep_answer if h else r.off for r, h in zip(tier_rows, hit)]
            curve.append({
                "threshold": t,
                "hit_rate": _mean([h for r, h in zip(tier_rows, hit) if r.probe.expect_hit]),
                "false_hit_rate": _mean([h and r.sweep_gt != r.probe.gt
                                         for r, h in zip(tier_rows, hit)]),
                "accuracy": _mean([a == r.probe.gt for r, a in zip(tier_rows, answers)])})
        curves[name] = curve
    return curves


def _engine(model_dir: Path, store: str, args: argparse.Namespace) -> Any:
    from vlmcache.api import CachedLLM
    from vlmcache.config import VlmCacheConfig

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    config = VlmCacheConfig(store_path=store, block_size=32, log_requests=False,
                            enable_image_embedding=True, enable_semantic_text=True,
                            image_threshold=args.threshold,
                            semantic_text_threshold=args.threshold,
                            prompt_threshold=args.threshold, image_embedder=args.image_embedder)
    engine_args = {"gpu_memory_utilization": 0.3, "max_model_len": 256, "block_size": 32,
                   "enforce_eager": True, "limit_mm_per_prompt": {"image": 1}, "seed": 0,
                   "dtype": "float32"}
    return CachedLLM(str(model_dir), config, engine_args=engine_args)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=60, help="easy-vqa test images used")
    parser.add_argument("--threshold", type=float, default=0.85)
    parser.add_argument("--image-embedder", default="efficientnet-lite0")
    parser.add_argument("--model-dir", default=".cache/tiny-vqa")
    parser.add_argument("--out", default="benchmarks/results/fidelity.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--note", default="", help="recorded in the results file")
    parser.add_argument("--no-build", action="store_true",
                        help="use --model-dir as it is (an already built tiny-vqa checkpoint)")
    args = parser.parse_args(argv)
    from vllm import SamplingParams

    from vlmcache.models.tiny_vqa import build_tiny_vqa

    model_dir = args.model_dir if args.no_build else build_tiny_vqa(args.model_dir)
    seeds, probes = build_probes(args.images, args.seed)
    params = SamplingParams(temperature=0.0, max_tokens=4, stop=["<|im_end|>"])
    with tempfile.TemporaryDirectory() as store:
        llm = _engine(Path(model_dir), store, args)
        try:
            rows = run(llm, seeds, probes, params)
        finally:
            llm._cascade.flush()  # before the store directory goes
            llm.close()
    summary, curves = summarize(rows), sweep(rows)
    _write(args, argv, summary, curves, rows)


def _row_json(row: Row) -> dict[str, Any]:
    return {"category": row.probe.category, "image": row.probe.image_id,
            "question": row.probe.question, "gt": row.probe.gt, "on": row.on, "off": row.off,
            "hit_tier": row.hit_tier, "canonical_gt": row.canonical_gt,
            "scores": {k: round(v, 4) for k, v in row.scores.items()}, "gated": row.gated}


def _model_config(model_dir: Path) -> dict[str, Any]:
    try:
        cfg = json.loads((model_dir / "config.json").read_text())
        return {"vision_patch_size": cfg["vision_config"]["patch_size"],
                "image_size": cfg["vision_config"]["image_size"]}
    except (OSError, KeyError, ValueError):
        return {}


def _write(args: argparse.Namespace, argv: Sequence[str] | None, summary: dict[str, Any],
           curves: dict[str, Any], rows: Sequence[Row]) -> None:
    import vllm

    cmd = "python benchmarks/fidelity.py " + shlex.join(argv if argv is not None else sys.argv[1:])
    result = {
        "command": cmd.strip(),
        "model": "tiny-vqa (trained on easy-vqa; SmolLM2-135M-Instruct + 64px CLIP tower)",
        "model_config": _model_config(Path(args.model_dir)),
        "device": f"vLLM-CPU {vllm.__version__} ({platform.machine()}, {os.cpu_count()} cores)",
        "image_embedder": args.image_embedder, "text_embedder": "all-MiniLM-L6-v2",
        "threshold": args.threshold, "gate": True,
        "seed_requests": sum(r.probe.category == "seed" for r in rows),
        "probes": sum(r.probe.category != "seed" for r in rows),
        "note": args.note,
        "tiers": {k: v for k, v in summary.items() if k in TIER_CATEGORIES},
        "categories": {k[9:]: v for k, v in summary.items() if k.startswith("category:")},
        "gate_cost": gate_cost(curves, args.threshold),
        "threshold_sweep": curves,
        "notes": __doc__.split("\n\n", 1)[1].strip(),
        "rows": [_row_json(r) for r in rows],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    plot(curves, out.with_suffix(".png"),
         f"{result['model']}; image embedder {args.image_embedder}; {result['probes']} probes")
    print(table(summary))
    print("gate cost:", json.dumps(result["gate_cost"]))
    print(f"wrote {out} and {out.with_suffix('.png')}")


if __name__ == "__main__":
    main()
