"""Calibration curves for :mod:`vlmcache.tiers.calibration`, measured on easy-vqa *train*
images (the fidelity evaluation uses the test images), without a VLM: only the tiers.

- ``image_verify``: train images are made canonical in an :class:`ImageEmbeddingTier`
  (the default embedder and cosine floor, verification off); each benign variant is a
  positive (a hit at ``t`` when its own source is among the candidates at distance <= t),
  each hard
  negative (recolour, mirror, count, other image of the same shape and colour) a
  negative (a false hit when any candidate is at distance <= t); the same for views of
  the *train* photographs (:mod:`vlmcache_lab.fidelity_photos`) with their benign
  variants and photo-editor colour edits.
- ``semantic_facet``: per image, three template questions are cached; probes are
  tiny-vqa's *training* rewordings of them (positives) and every other template question
  about the same image (negatives when their easy-vqa answer differs), plus general VQA
  contrast pairs (``CONTRAST_PAIRS``: same kind, another meaning). The second stage
  admits a candidate when :func:`~vlmcache.tiers.gates.second_stage_ok` holds and the
  cosine is >= t; a false hit is an admitted negative.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from vlmcache_lab.fidelity_data import ShapeAttrs, answer, easy_vqa_split
from vlmcache_lab.fidelity_variants import BENIGN, HARD
from vlmcache.tiers.calibration import CurvePoint

#: Question pairs of the same kind and facets but another meaning (general VQA): the
#: negatives a lower cosine must not admit (easy-vqa alone has none: the gate refuses all).
CONTRAST_PAIRS = (
    ("what color is the car?", "what color is the sky?"),
    ("what color is the shirt?", "what color is the hat?"),
    ("what color is the cat?", "what color is the dog?"),
    ("what color is the wall?", "what color is the floor?"),
    ("what color are the shoes?", "what color are the pants?"),
    ("which colour is the bus?", "which colour is the train?"),
    ("what colour is the left car?", "what colour is the left truck?"),
    ("is the shape big?", "is the shape small?"),
    ("is the door open?", "is the door closed?"),
    ("is the man smiling?", "is the man standing?"),
    ("is it day?", "is it night?"),
    ("is the road wet?", "is the road dry?"),
    ("is the cat sleeping?", "is the cat eating?"),
    ("is the light on?", "is the light off?"),
    ("is the glass full?", "is the glass empty?"),
    ("is the woman sitting?", "is the woman walking?"),
    ("is the shape filled?", "is the shape hollow?"),
    ("is the shape in the middle?", "is the shape near the edge?"),
    ("is the picture blurry?", "is the picture sharp?"),
    ("is there a dog?", "is there a cat?"),
    ("is there a car?", "is there a bicycle?"),
    ("is the person a man?", "is the person a woman?"),
    ("does the man wear glasses?", "does the man wear a hat?"),
    ("can you see a tree?", "can you see a house?"),
    ("how many people are there?", "how many cars are there?"),
    ("how many shapes are there?", "how many colors are there?"),
    ("how many dogs are in the picture?", "how many cats are in the picture?"),
    ("what shape is the table?", "what shape is the window?"),
    ("what shape is the sign?", "what shape is the plate?"),
    ("which shape is larger?", "which shape is smaller?"),
    ("which shape is closest?", "which shape is farthest?"),
    ("what color is the largest shape?", "what color is the smallest shape?"),
    ("is the shape rotated?", "is the shape upright?"),
    ("is the sky cloudy?", "is the sky clear?"),
    ("is the water calm?", "is the water rough?"),
    ("is the food hot?", "is the food cold?"),
    ("is the shape touching the border?", "is the shape centred?"),
    ("is the man old?", "is the man young?"),
    ("is the store open?", "is the store busy?"),
    ("what color is the text?", "what color is the background?"),
)
VERIFY_GRID = tuple(round(t, 3) for t in np.arange(0.05, 0.401, 0.005))
COSINE_GRID = tuple(round(t, 3) for t in np.arange(0.65, 0.951, 0.01))  # floor: see docs


def train_images(n: int) -> tuple[list[Any], list[ShapeAttrs], dict[int, list[str]]]:
    """The first ``n`` usable easy-vqa train images, their attributes and questions."""
    from PIL import Image

    attrs, paths, by_image = easy_vqa_split("train")
    chosen = sorted(attrs)[:n]
    return ([Image.open(paths[i]).convert("RGB") for i in chosen], [attrs[i] for i in chosen],
            {k: by_image[i] for k, i in enumerate(chosen)})


def image_distances(tier: Any, images: Sequence[Any], attrs: Sequence[ShapeAttrs],
                    seed: int, benign: dict = BENIGN,
                    hard: dict = HARD) -> tuple[list[float], list[float]]:
    """(positives' own-source distance, negatives' best distance); inf when no candidate.
    ``benign`` and ``hard``: the variant tables (easy-vqa's by default)."""
    from vlmcache.keys import image_content_hash

    hashes = [image_content_hash(im) for im in images]
    for im, h in zip(images, hashes):
        tier.record(im, h, None)
    rng = np.random.default_rng(seed)
    pos, neg = [], []
    for k, (im, a) in enumerate(zip(images, attrs)):
        for kinds, out in ((benign, pos), (hard, neg)):
            for fn in kinds.values():
                v = fn(im, a, rng, "what color is the shape?")
                if v is None:
                    continue
                found = _candidates(tier, v.image)
                own = [d for c, d in found if c == hashes[k]]
                out.append(min(own) if kinds is benign and own else
                           min((d for _, d in found), default=np.inf) if kinds is hard
                           else np.inf)
        same = [j for j, b in enumerate(attrs) if b == a and j != k]
        if same:  # another image of the same shape and colour, not cached itself
            probe = images[same[0]]
            neg.append(min((d for c, d in _candidates(tier, probe) if c != hashes[same[0]]),
                           default=np.inf))
    return pos, neg


def _candidates(tier: Any, image: Any) -> list[tuple[str, float]]:
    from vlmcache.keys import image_content_hash

    h = image_content_hash(image)
    return [(hit.entry.context, d) for hit, _, d in tier.verified_candidates(image, h, None)
            if hit.score >= tier.threshold]


def train_photo_views(per_photo: int, seed: int) -> tuple[list[Any], list[ShapeAttrs]]:
    """``per_photo`` views of each *train* photograph, each its own attributes (no two
    views count as the same picture)."""
    from vlmcache_lab.fidelity_photos import load_photo, photo_split, views

    rng = np.random.default_rng([seed, 13])
    out, attrs = [], []
    for name in photo_split("train"):
        for k, view in enumerate(views(load_photo(name), per_photo, rng)):
            out.append(view)
            attrs.append(ShapeAttrs("photo", f"{name}{k}"))
    return out, attrs


def image_curve(pos: Sequence[float], neg: Sequence[float]) -> list[CurvePoint]:
    return [CurvePoint(float(t), int(sum(d <= t for d in neg)), len(neg),
                       int(sum(d <= t for d in pos)), len(pos))
            for t in VERIFY_GRID]


def text_pairs(embedder: Any, questions: dict[int, list[str]], attrs: Sequence[ShapeAttrs],
               seed: int) -> tuple[list[float], list[float]]:
    """(positives' cosine, negatives' cosine) of second-stage-admissible pairs."""
    from vlmcache.models.paraphrases import TEMPLATES, TRAIN_PARAPHRASES, paraphrase
    from vlmcache.tiers.gates import second_stage_ok

    rng = np.random.default_rng(seed)
    pos, neg = [], []
    for k, a in enumerate(attrs):
        qs = list(dict.fromkeys(questions[k]))
        cached = [qs[int(i)] for i in rng.choice(len(qs), min(3, len(qs)), replace=False)]
        probes = [(paraphrase(q, int(rng.integers(6)), TRAIN_PARAPHRASES), q) for q in cached]
        probes += [(t.format(color=a.color, shape=a.shape), None) for t in TEMPLATES]
        vecs = embedder.embed(cached + [p for p, _ in probes])
        cvec, pvec = vecs[:len(cached)], vecs[len(cached):]
        for (probe, meaning), v in zip(probes, pvec):
            truth = answer(meaning or probe, a)
            for c, cv in zip(cached, cvec):
                cos = float(v @ cv) if second_stage_ok(probe, c) else -np.inf
                if meaning is not None and c == meaning:
                    pos.append(cos)
                elif c != probe and answer(c, a) != truth:
                    neg.append(cos)
    for x, y in CONTRAST_PAIRS + tuple((y, x) for x, y in CONTRAST_PAIRS):
        vx, vy = embedder.embed([x, y])
        neg.append(float(vx @ vy) if second_stage_ok(x, y) else -np.inf)
    return pos, neg


def text_curve(pos: Sequence[float], neg: Sequence[float]) -> list[CurvePoint]:
    return [CurvePoint(float(t), int(sum(c >= t for c in neg)), len(neg),
                       int(sum(c >= t for c in pos)), len(pos))
            for t in COSINE_GRID]


def calibrate(n_images: int, image_embedder: str, seed: int = 0,
              photo_views: int = 6) -> dict[str, list[CurvePoint]]:
    """Both curves, measured on the first ``n_images`` usable train images (and, for the
    verifier, ``photo_views`` views of each train photograph)."""
    from vlmcache_lab.fidelity_photos import PHOTO_BENIGN, PHOTO_HARD
    import tempfile
    from pathlib import Path

    from vlmcache.config import VlmCacheConfig
    from vlmcache.embedders import Memoized, make_image_embedder, make_text_embedder, text_digest
    from vlmcache.keys import image_content_hash
    from vlmcache.store.memory import MemoryStore
    from vlmcache.store.tiered import TieredStore
    from vlmcache.tiers.image_embedding import ImageEmbeddingTier

    images, attrs, questions = train_images(n_images)
    with tempfile.TemporaryDirectory() as tmp:
        store = TieredStore(MemoryStore(64 * 1024**2), None)
        tier = ImageEmbeddingTier(Path(tmp) / "img", "calibration",
                                  Memoized(make_image_embedder(image_embedder),
                                           image_content_hash), store,
                                  threshold=VlmCacheConfig().image_threshold,  # the default
                                  verify_threshold=1.0, candidates=4)
        pos, neg = image_distances(tier, images, attrs, seed)
        photos, photo_attrs = train_photo_views(photo_views, seed)
        ppos, pneg = image_distances(tier, photos, photo_attrs, seed, PHOTO_BENIGN, PHOTO_HARD)
        pos, neg = pos + ppos, neg + pneg
    text = Memoized(make_text_embedder("minilm"), text_digest)
    tpos, tneg = text_pairs(text, questions, attrs, seed)
    return {"image_verify": image_curve(pos, neg), "semantic_facet": text_curve(tpos, tneg)}


def candidate_recall(names: Sequence[str], n_images: int, per_kind: int = 100,
                     seed: int = 0) -> dict[str, Any]:
    """Per embedder and benign kind: how often the source image is the top-1 / in the
    top-4 of ``n_images`` easy-vqa test images (what the verifier gets to see), and the
    embedding time per image."""
    import time

    from PIL import Image

    from vlmcache.embedders import make_image_embedder

    attrs, paths, _ = easy_vqa_split("test")
    chosen = sorted(attrs)[:n_images]
    images = [Image.open(paths[i]).convert("RGB") for i in chosen]
    out: dict[str, Any] = {}
    for name in names:
        emb = make_image_embedder(name)
        base = emb.embed(images)
        start = time.perf_counter()
        emb.embed(images[:20])
        row: dict[str, Any] = {"embed_ms": round((time.perf_counter() - start) / 20 * 1e3, 3)}
        rng = np.random.default_rng(seed)
        for kind, fn in BENIGN.items():
            ranks = []
            for j in range(min(per_kind, len(images))):
                v = fn(images[j], attrs[chosen[j]], rng, "q")
                if v is not None:
                    sims = base @ emb.embed([v.image])[0]
                    ranks.append(int((sims > sims[j]).sum()))
            row[kind] = {"n": len(ranks), "top1": round(float(np.mean(np.array(ranks) < 1)), 3),
                         "top4": round(float(np.mean(np.array(ranks) < 4)), 3)}
        out[name] = row
    return out
