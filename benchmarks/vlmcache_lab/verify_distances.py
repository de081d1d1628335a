"""The image verifier alone, per variant kind: the distance between each variant and its
source (no embedder, no ANN search), so a miss can be told apart from a candidate-stage miss.

    python benchmarks/verify_distances.py --images 200 \\
        --out benchmarks/results/verify-distances.json

Benign kinds should fall under the verify threshold and hard negatives far above it;
``hard:other_same_template`` is another easy-vqa image of the same shape and colour.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from vlmcache_lab.fidelity_calibrate import train_images
from vlmcache_lab.fidelity_data import ShapeAttrs, video
from vlmcache_lab.fidelity_variants import BENIGN, HARD
from vlmcache.tiers import verify as V


def distance(query: Any, source: Any) -> float:
    return V.verify(V.prepare(query, (1.0,)), V.prepare(source)).distance


def distances(images: Sequence[Any], attrs: Sequence[ShapeAttrs],
              seed: int = 0) -> dict[str, list[float]]:
    """Per kind: each variant's verified distance to its source image."""
    rng = np.random.default_rng(seed)
    out: dict[str, list[float]] = {}
    for k, (im, a) in enumerate(zip(images, attrs)):
        for name, fn in {**BENIGN, **HARD}.items():
            v = fn(im, a, rng, "what color is the shape?")
            if v is not None:
                out.setdefault(name, []).append(distance(v.image, im))
        frames = video(a, 4, rng)
        for f in (1, 2, 3):
            out.setdefault(f"benign:video_frame_{f}", []).append(distance(frames[f], frames[0]))
        same = [j for j, b in enumerate(attrs) if b == a and j != k]
        if same:
            out.setdefault("hard:other_same_template", []).append(distance(images[same[0]], im))
    return out


def summary(values: Sequence[float], threshold: float) -> dict[str, float]:
    v = np.asarray(values)
    return {"n": int(v.size), "pass_rate": round(float(np.mean(v <= threshold)), 4),
            "p01": round(float(np.quantile(v, 0.01)), 4),
            "p50": round(float(np.median(v)), 4), "p90": round(float(np.quantile(v, 0.9)), 4),
            "min": round(float(v.min()), 4), "max": round(float(v.max()), 4)}


def main(argv: Sequence[str] | None = None) -> None:
    from vlmcache.config import VlmCacheConfig
    from vlmcache.tiers import calibration

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=200)
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/verify-distances.json"))
    args = ap.parse_args(argv)
    cfg = VlmCacheConfig()
    threshold = calibration.threshold("image_verify", cfg.image_verify_threshold,
                                      cfg.max_false_hit_rate, cfg.calibration_file)
    images, attrs, _ = train_images(args.images)
    kinds = {k: summary(v, threshold) for k, v in sorted(distances(images, attrs).items())}
    result = {"command": f"python benchmarks/verify_distances.py --images {args.images}",
              "verify_threshold": threshold, "images": "easy-vqa train", "kinds": kinds}
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for k, s in kinds.items():
        print(f"{k:30s} {s}")


if __name__ == "__main__":
    main()
