"""Lookup latency of :meth:`Cascade.resolve` with 100k (and 1M) entries per tier (CPU).

The cascade is the one :func:`~vlmcache.cascade.build_cascade` makes from the default
``VlmCacheConfig`` with both similarity tiers on (exact text, colour-layout image embedding
with verification, MiniLM semantic text), on a temporary store. Each tier holds
``--entries`` entries: the exact tier as records in its own log format (loaded by the
tier), the image index and the text index as random unit vectors of the real embedders'
dimensions (192 for colour-layout, 384 for MiniLM), added with ``VectorIndex.add_many``
(one FAISS add; the image index becomes HNSW past ``vector_index_hnsw_threshold``):
embedding 100k real questions would take most of an hour. Text entries are spread over
one scope (tenant + canonical images) each, as a cache of many images is; the two text
layers share one index object (a scoped search costs the same). Random vectors are far
from each other: a miss proposes no image candidate, so it is not verified.

Queries are real: a canonical image and question are recorded through the tiers, then
``--queries`` requests per scenario are resolved through the real embedders:

- ``hit``: a near-duplicate of the canonical image (pixel noise, so a new content hash)
  with a paraphrase of the canonical question;
- ``miss``: a new image with an unrelated question (no text entry about that image).

Each request is resolved twice: ``fresh`` (nothing memoized) and ``repeated`` (image and
text embeddings memoized: the rest is search). The split is measured on the same inputs:
the inner embedders alone (colour-layout of the image and of its four shifted views, as a
miss needs; MiniLM of the stripped prompt and the question, batched as the text tier
does) and the index searches alone (the image searches, one per view as on a miss, and
both text layers' searches under the context ``resolve`` used).
"""

from __future__ import annotations

import argparse
import atexit
import hashlib
import itertools
import json
import os
import platform
import shlex
import sys
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

CANONICAL_QUESTION = "What color is the car?"
NAMESPACE = "6c" * 32
#: What is timed per request (ms); the table's rows.
ROWS = ("resolve_fresh", "resolve_repeated", "embed_image", "embed_text", "search_image",
        "search_text")


def _prompt(question: str) -> str:
    return f"USER: <image>\n{question} ASSISTANT:"


def _unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    v = rng.standard_normal((n, dim), dtype=np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _hashes(n: int) -> list[str]:
    return [hashlib.sha256(f"bench-image-{i}".encode()).hexdigest() for i in range(n)]


def bulk_add(index: Any, entries: Sequence[Any], vectors: np.ndarray) -> None:
    """One batched add (the index builds its configured kind once)."""
    index.add_many(list(entries), vectors)


def _fill_exact(cascade: Any, hashes: Sequence[str]) -> None:
    """Write ``len(hashes)`` records in the exact tier's log format and reload the tier."""
    from vlmcache.tiers.exact import ExactRecord, ExactTextTier

    tier = cascade.exact
    tier.path.parent.mkdir(parents=True, exist_ok=True)
    with open(tier.path, "w", encoding="utf-8") as f:
        for i, h in enumerate(hashes):
            prompt = _prompt(f"bench question {i}?")
            rec = ExactRecord(tier.key(prompt, (h,), None), prompt, (h,), (h,), 16, 0.0)
            f.write(json.dumps(asdict(rec), separators=(",", ":")) + "\n")
    cascade.exact = ExactTextTier(tier.path, tier.namespace_digest, tier.max_entries)


def _fill_vectors(cascade: Any, hashes: Sequence[str], seed: int) -> None:
    """Random unit vectors into the image index and the (shared) text index."""
    from vlmcache.index.faiss_index import IndexEntry
    from vlmcache.tiers.image_embedding import image_store_key
    from vlmcache.tiers.semantic_text import image_context

    rng = np.random.default_rng(seed)
    image, text = cascade.image, cascade.text
    bulk_add(image.index, [IndexEntry(image_store_key(NAMESPACE, None, h), None, h)
                           for h in hashes], _unit(rng, len(hashes), image.index.dim))
    entries = [IndexEntry(f"bench-text-{i}", None, image_context((h,)),
                          _prompt(f"bench question {i}?"),
                          json.dumps({"question": f"bench question {i}?"}))
               for i, h in enumerate(hashes)]
    index = next(iter(text.indexes.values()))
    bulk_add(index, entries, _unit(rng, len(hashes), index.dim))


def build(store: Path, entries: int, hnsw_threshold: int, seed: int = 0) -> tuple[Any, Any]:
    """The filled cascade and the canonical image (recorded with its question)."""
    from vlmcache.cascade import build_cascade
    from vlmcache.config import VlmCacheConfig
    from vlmcache.keys import image_content_hash
    from vlmcache.testing.tiny_llava import make_test_image
    from vlmcache.tiers.semantic_text import TextQuery, image_context

    config = VlmCacheConfig(store_path=str(store), enable_image_embedding=True,
                            enable_semantic_text=True, log_requests=False,
                            exact_max_entries=max(entries, 1),
                            vector_index_hnsw_threshold=hnsw_threshold)
    cascade = build_cascade(config, NAMESPACE)
    shared = next(iter(cascade.text.indexes.values()))
    cascade.text.indexes = {layer: shared for layer in cascade.text.indexes}
    canon = make_test_image(seed)
    h = image_content_hash(canon)
    cascade.image.record(canon, h, None)
    cascade.text.record(TextQuery(CANONICAL_QUESTION, _prompt(CANONICAL_QUESTION),
                                  image_context((h,)), None))
    cascade.flush()
    hashes = _hashes(entries)
    _fill_exact(cascade, hashes)
    _fill_vectors(cascade, hashes, seed)
    for tier in (cascade.image, cascade.text):  # throwaway indexes: never saved at exit
        atexit.unregister(tier.flush)
    return cascade, canon


def requests(canon: Any, n: int, seed: int = 0) -> dict[str, list[tuple[Any, str]]]:
    """``n`` (image, question) pairs per scenario, all distinct (nothing memoized)."""
    from PIL import Image

    from vlmcache.testing.tiny_llava import make_test_image

    rng = np.random.default_rng(seed + 1)
    para = [f"{a} {b}{c}" for a, b, c in itertools.product(
        ("What color is", "Which colour is", "What colour is", "Which color is",
         "What is the color of", "Tell me the colour of"),
        ("the car", "the vehicle", "this car", "that car", "the automobile"),
        ("?", " in the image?", " in the picture?", " shown here?"))]
    other = [f"How many {a} are {b}{c}" for a, b, c in itertools.product(
        ("people", "trees", "windows", "dogs", "birds", "clouds"),
        ("visible", "in the photo", "on the left", "near the road", "in the scene"),
        ("?", " right now?", " at all?", " there?"))]
    if n > min(len(para), len(other)):
        raise ValueError(f"--queries: at most {min(len(para), len(other))}")
    base = np.asarray(canon, np.float32)
    near = [Image.fromarray(np.clip(base + rng.normal(0, 3, base.shape), 0, 255)
                            .astype(np.uint8)) for _ in range(n)]
    rng.shuffle(para)
    return {"hit": list(zip(near, para[:n])),
            "miss": [(make_test_image(10_000 + i), other[i]) for i in range(n)]}


def _ms(fn: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return (time.perf_counter() - start) * 1e3, out


def measure(cascade: Any, pairs: Sequence[tuple[Any, str]]) -> dict[str, Any]:
    """Per-request timings of one scenario (ms, p50/p90), and which tier decided."""
    times: dict[str, list[float]] = {k: [] for k in ROWS}
    tiers: dict[str, int] = {}
    for im, question in pairs:
        row, hit_tier = _one(cascade, im, question)
        for key, ms in row.items():
            times[key].append(ms)
        tiers[str(hit_tier)] = tiers.get(str(hit_tier), 0) + 1
    return {"hit_tiers": tiers, **{f"{k}_ms": _percentiles(v) for k, v in times.items()}}


def _one(cascade: Any, im: Any, question: str) -> tuple[dict[str, float], str | None]:
    """One request: inner embedders, resolve fresh then repeated, the searches alone."""
    from vlmcache.keys import image_content_hash
    from vlmcache.tiers.semantic_text import (
        PROMPT_LAYER,
        QUESTION_LAYER,
        TextQuery,
        image_context,
        query_scope,
        strip_placeholders,
    )

    image, text = cascade.image, cascade.text
    h, prompt = image_content_hash(im), _prompt(question)
    row: dict[str, float] = {}
    # the image and its shifted views: what a miss embeds (a hit stops after the image's
    # own candidates; ImageEmbeddingTier.shifted_views)
    row["embed_image"], vecs = _ms(
        lambda: image.embedder.inner.embed([im] + image.shifted_views(im, h)[0]))
    row["embed_text"], tvecs = _ms(
        lambda: text.embedder.inner.embed([strip_placeholders(prompt), question]))
    row["resolve_fresh"], _ = _ms(
        lambda: cascade.resolve(prompt, (h,), None, images=(im,), question=question))
    row["resolve_repeated"], res = _ms(
        lambda: cascade.resolve(prompt, (h,), None, images=(im,), question=question))
    row["search_image"], _ = _ms(lambda: [image.index.search_scope(v, "None", k=4)
                                          for v in vecs])
    scope = query_scope(TextQuery(question, prompt, image_context(res.image_hashes), None))
    row["search_text"], _ = _ms(lambda: [
        text.indexes[layer].search_scope(v, scope, k=4)
        for layer, v in zip((PROMPT_LAYER, QUESTION_LAYER), tvecs)])
    return row, res.hit_tier


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    p50, p90 = np.percentile(values, [50, 90])
    return {"p50": round(float(p50), 3), "p90": round(float(p90), 3)}


def _device() -> dict[str, Any]:
    import faiss

    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": model, "cores": cores, "faiss_threads": faiss.omp_get_max_threads(),
            "load_avg_1m_at_start": round(os.getloadavg()[0], 2)}


def run(entries: int, queries: int, hnsw_threshold: int) -> dict[str, Any]:
    """Build, warm up the embedders, measure both scenarios; the results record."""
    device = _device()
    with tempfile.TemporaryDirectory(prefix="vlmcache-lookup-") as store:
        start = time.perf_counter()
        cascade, canon = build(Path(store), entries, hnsw_threshold)
        fill_s = time.perf_counter() - start
        for i in range(3):  # loads MiniLM; first forward passes are slower
            cascade.text.embedder.inner.embed([f"warm-up {i}", f"USER: warm-up {i}?"])
        scenarios = {name: measure(cascade, pairs)
                     for name, pairs in requests(canon, queries).items()}
        indexes = {"exact_text": {"entries": len(cascade.exact)},
                   "embedding:vision": _index_info(cascade.image.index),
                   "text (prompt and question layers, one shared index)":
                       _index_info(next(iter(cascade.text.indexes.values())))}
    return {"device": device, "entries_per_tier": entries, "queries_per_scenario": queries,
            "vector_index_hnsw_threshold": hnsw_threshold,
            "image_embedder": "colour-layout (192-d) + verifier",
            "text_embedder": "all-MiniLM-L6-v2 (384-d)", "indexes": indexes,
            "build_and_fill_s": round(fill_s, 1), "scenarios": scenarios}


def _run_summary(record: dict[str, Any]) -> dict[str, Any]:
    """``resolve_p50_ms``: resolve with embeddings memoized (search + verification), the
    hit scenario (the miss one beside it); ``embed_p50_ms``: the embedders alone."""
    hit, miss = record["scenarios"]["hit"], record["scenarios"]["miss"]
    embed = hit["embed_image_ms"]["p50"] + hit["embed_text_ms"]["p50"]
    return {"entries": record["entries_per_tier"],
            "resolve_p50_ms": hit["resolve_repeated_ms"]["p50"],
            "resolve_p50_ms_miss": miss["resolve_repeated_ms"]["p50"],
            "embed_p50_ms": round(embed, 3), "build_and_fill_s": record["build_and_fill_s"],
            "hit_tiers": hit["hit_tiers"]}


def _index_info(index: Any) -> dict[str, Any]:
    return {"entries": len(index), "dim": index.dim,
            "kind": "HNSW (approximate)" if index.kind == "hnsw" else "flat (exact)"}


def table(record: dict[str, Any]) -> str:
    """The p50/p90 of every measure, one column pair per scenario."""
    names = list(record["scenarios"])
    lines = [f"{'ms':<18}" + "".join(f"{n + ' p50':>12}{n + ' p90':>12}" for n in names)]
    for row in ROWS:
        cells = [record["scenarios"][n][f"{row}_ms"] for n in names]
        lines.append(f"{row:<18}" + "".join(f"{c['p50']:>12.2f}{c['p90']:>12.2f}"
                                            for c in cells))
    kinds = ", ".join(f"{k}: {v['kind']} x{v.get('entries')}" for k, v in
                      record["indexes"].items() if "kind" in v)
    lines.append(f"indexes: {kinds}; hit tiers: "
                 + "; ".join(f"{n} {record['scenarios'][n]['hit_tiers']}" for n in names))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", default="100000",
                        help="entries per tier; a comma list measures each (e.g. 100000,1000000)")
    parser.add_argument("--queries", type=int, default=30, help="requests per scenario")
    parser.add_argument("--hnsw-threshold", type=int, default=20_000,
                        help="vector_index_hnsw_threshold (the config default)")
    parser.add_argument("--out", default="benchmarks/results/lookup-latency.json")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    given = list(sys.argv[1:] if argv is None else argv)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    records: list[dict[str, Any]] = []
    for n in args.entries.split(","):  # written after each size: a larger one may not fit
        records.append(run(int(n), args.queries, args.hnsw_threshold))
        record = {"command": " ".join(["python benchmarks/lookup_latency.py",
                                       *map(shlex.quote, given)]), **records[0],
                  "runs": [_run_summary(r) for r in records], "all_runs": records,
                  "notes": __doc__.split("\n\n", 1)[1].strip()}
        out.write_text(json.dumps(record, indent=2) + "\n")
        print(table(records[-1]))
    print(f"wrote {out}")
    return record


if __name__ == "__main__":
    main()
