"""Request streams for ``vlmcache bench``, built from a dataset's samples.

Each workload models one kind of reuse a VLM cache should exploit (or must refuse):

* ``zipf``: popular (image, question) pairs asked again and again (exact reuse).
* ``paraphrase``: a question, then the same question reworded (semantic reuse).
* ``near_dup``: video-like frames: an image, then slightly shifted and noised copies.
* ``tenants``: every tenant asks the same pairs; tenants never share a cache entry.
* ``restart``: earlier requests asked again after an engine restart (persistence).

``build_requests`` is deterministic: the same arguments give the same list in every
process (numpy ``default_rng`` seeded from ``seed`` and the workload's name, no ``hash()``).

Splitting ``n``: the chosen workloads get ``n // k`` requests each and the first
``n % k`` of them (in the order given) one more, so the list has exactly ``n`` requests.
Blocks follow the order given; each workload draws from its own random stream, so its
block does not depend on which other workloads were chosen (except ``restart``, which
re-asks what came before it).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable, Sequence

import numpy as np

from vlmcache.bench.types import BenchRequest, ImageRef, Sample
from vlmcache.errors import ConfigError

WORKLOADS: tuple[str, ...] = ("zipf", "paraphrase", "near_dup", "tenants", "restart")
DEFAULT_WORKLOADS: tuple[str, ...] = WORKLOADS  # restart last: it re-asks all the others

ZIPF_EXPONENT = 1.1
PARAPHRASES_PER_QUESTION = 2
FRAMES_PER_SEQUENCE = 6
FRAME_SHIFT_PX = 2
FRAME_NOISE_SIGMA = 3.0

Paraphraser = Callable[[str, int], "str | None"]

_GENERIC_PARAPHRASES = (
    "Please answer: {q}",
    "{q} Answer briefly.",
    "Question: {q}",
    "Look at the image. {q}",
)


# --------------------------------------------------------------------------- paraphrases


def generic_paraphrase(question: str, variant: int) -> str:
    """A meaning-preserving rewording of any question (a fixed frame around it)."""
    return _GENERIC_PARAPHRASES[variant % len(_GENERIC_PARAPHRASES)].format(q=question.strip())


def default_paraphrase(question: str, variant: int) -> str:
    """easy-vqa's held-out template rewording if ``question`` is an easy-vqa template
    question, else :func:`generic_paraphrase`."""
    from vlmcache.models.paraphrases import paraphrase

    try:
        text = paraphrase(question, variant)
    except (LookupError, ValueError):
        return generic_paraphrase(question, variant)
    return text if _differs(text, question) else generic_paraphrase(question, variant)


def _differs(text: str | None, question: str) -> bool:
    """True when ``text`` is a real rewording (not empty, not the question itself)."""
    return text is not None and bool(text.strip()) and text.strip().lower() != question.strip().lower()


def _reword(question: str, variant: int, paraphraser: Paraphraser | None) -> str:
    """``paraphraser``'s rewording; :func:`default_paraphrase` when it returns None or the
    question itself, or raises ``LookupError`` / ``ValueError`` (e.g. easy-vqa's parser on
    a non-template question). Other exceptions are bugs and propagate."""
    if paraphraser is None:
        return default_paraphrase(question, variant)
    try:
        text = paraphraser(question, variant)
    except (LookupError, ValueError):
        text = None
    return text if text is not None and _differs(text, question) else default_paraphrase(
        question, variant)


# --------------------------------------------------------------------------- helpers


def _rng(seed: int, workload: str) -> np.random.Generator:
    """A random stream per (seed, workload): independent of the other workloads chosen."""
    return np.random.default_rng([seed % 2**63, WORKLOADS.index(workload)])


def _request(workload: str, sample: Sample, **fields: object) -> BenchRequest:
    """A request for ``sample`` (index set later); ``fields`` override the defaults."""
    base: dict[str, object] = {
        "index": 0, "workload": workload, "image": ImageRef(str(sample.image_path)),
        "question": sample.question, "answer": sample.answer,
    }
    base.update(fields)
    return BenchRequest(**base)  # type: ignore[arg-type]


def _picks(samples: Sequence[Sample], k: int, rng: np.random.Generator) -> list[Sample]:
    """``k`` samples, distinct while the dataset lasts (then another permutation)."""
    out: list[Sample] = []
    while len(out) < k:
        out.extend(samples[int(i)] for i in rng.permutation(len(samples)))
    return out[:k]


def _split(n: int, count: int) -> list[int]:
    return [n // count + (1 if i < n % count else 0) for i in range(count)]


def _validate(workloads: Sequence[str], n: int, tenants: int, samples: Sequence[Sample]) -> None:
    allowed = ", ".join(WORKLOADS)
    if isinstance(workloads, str) or not workloads:
        raise ConfigError(f"workloads: give a list of one or more of: {allowed}")
    for name in workloads:
        if name not in WORKLOADS:
            raise ConfigError(f"workloads: unknown workload {name!r}; allowed: {allowed}")
    dupes = sorted(name for name, c in Counter(workloads).items() if c > 1)
    if dupes:
        raise ConfigError(f"workloads: listed more than once: {', '.join(dupes)}")
    if n < 0:
        raise ConfigError(f"n must be >= 0, got {n}")
    if tenants < 1:
        raise ConfigError(f"tenants must be >= 1, got {tenants}")
    if not samples:
        raise ConfigError("no samples to build requests from (empty dataset)")


# --------------------------------------------------------------------------- workloads


def _zipf(samples: Sequence[Sample], count: int, rng: np.random.Generator) -> list[BenchRequest]:
    """``count`` draws from a pool of up to ``count`` pairs, P(rank r) ~ r^-1.1."""
    pool = _picks(samples, min(len(samples), count), rng) if count else []
    if not pool:
        return []
    weights = np.arange(1, len(pool) + 1, dtype=np.float64) ** -ZIPF_EXPONENT
    draws = rng.choice(len(pool), size=count, p=weights / weights.sum())
    seen: set[tuple[str, str]] = set()
    out: list[BenchRequest] = []
    for i in draws:
        sample = pool[int(i)]
        key = (str(sample.image_path), sample.question)
        out.append(_request("zipf", sample, expect_reuse=key in seen))
        seen.add(key)
    return out


def _paraphrase(samples: Sequence[Sample], count: int, rng: np.random.Generator,
                paraphraser: Paraphraser | None) -> list[BenchRequest]:
    """Groups of: the original question, then ``PARAPHRASES_PER_QUESTION`` rewordings."""
    group = 1 + PARAPHRASES_PER_QUESTION
    out: list[BenchRequest] = []
    for sample in _picks(samples, -(-count // group), rng):
        out.append(_request("paraphrase", sample))
        for variant in range(PARAPHRASES_PER_QUESTION):
            text = _reword(sample.question, variant, paraphraser)
            out.append(_request("paraphrase", sample, question=text, meaning=sample.question,
                                expect_reuse=True))
    return out[:count]


def _near_dup(samples: Sequence[Sample], count: int, rng: np.random.Generator) -> list[BenchRequest]:
    """Sequences of ``FRAMES_PER_SEQUENCE`` frames: the original image, then frames shifted
    by ``FRAME_SHIFT_PX`` more pixels each (a horizontal pan) with Gaussian noise."""
    out: list[BenchRequest] = []
    for sample in _picks(samples, -(-count // FRAMES_PER_SEQUENCE), rng):
        seeds = rng.integers(0, 2**31, size=FRAMES_PER_SEQUENCE)
        for frame in range(FRAMES_PER_SEQUENCE):
            image = ImageRef(str(sample.image_path))
            if frame:
                image = ImageRef(str(sample.image_path), shift=(FRAME_SHIFT_PX * frame, 0),
                                 noise_sigma=FRAME_NOISE_SIGMA, noise_seed=int(seeds[frame]))
            out.append(_request("near_dup", sample, image=image, expect_reuse=frame > 0))
    return out[:count]


def _tenants(samples: Sequence[Sample], count: int, tenants: int,
             rng: np.random.Generator) -> list[BenchRequest]:
    """Per pair: asked by tenant-0 .. tenant-(T-1) (first asks), then again by each."""
    names = [f"tenant-{t}" for t in range(tenants)]
    out: list[BenchRequest] = []
    for sample in _picks(samples, -(-count // (2 * tenants)), rng):
        for repeat in (False, True):
            out.extend(_request("tenants", sample, tenant=name, expect_reuse=repeat)
                       for name in names)
    return out[:count]


def _restart(samples: Sequence[Sample], count: int, history: Sequence[BenchRequest],
             rng: np.random.Generator) -> list[BenchRequest]:
    """Earlier requests asked again, the first with ``restart_before=True``.

    With no earlier requests (``restart`` first or alone) the block first asks half of
    its requests itself, then restarts and re-asks them.
    """
    warm: list[BenchRequest] = []
    if not history:
        warm = [_request("restart", s) for s in _picks(samples, count - count // 2, rng)]
        history = warm
    distinct: dict[tuple[str, str, str | None], BenchRequest] = {}
    for req in history:
        distinct.setdefault((req.image.id, req.question, req.tenant), req)
    originals = list(distinct.values())
    order: list[int] = []
    while len(order) < count - len(warm):
        order.extend(int(i) for i in rng.permutation(len(originals)))
    again = [dataclasses.replace(originals[i], workload="restart", expect_reuse=True,
                                 restart_before=j == 0)
             for j, i in enumerate(order[:count - len(warm)])]
    return warm + again


# --------------------------------------------------------------------------- public API


def build_requests(samples: Sequence[Sample], workloads: Sequence[str], n: int, seed: int,
                   tenants: int = 2,
                   paraphraser: Callable[[str, int], str | None] | None = None) -> list[BenchRequest]:
    """The run's request list: ``n`` requests split evenly over ``workloads`` (the first
    ``n % len(workloads)`` get one more), one block per workload in the order given.

    Deterministic for equal arguments; ``index`` is the position in the list. Only the
    ``tenants`` workload sets ``tenant`` (``restart`` keeps the tenant of what it
    re-asks). ``paraphraser(question, variant)`` rewords questions for ``paraphrase``
    (``None`` or an unchanged question: :func:`default_paraphrase`).
    """
    _validate(workloads, n, tenants, samples)
    out: list[BenchRequest] = []
    for name, count in zip(workloads, _split(n, len(workloads))):
        rng = _rng(seed, name)
        if name == "zipf":
            block = _zipf(samples, count, rng)
        elif name == "paraphrase":
            block = _paraphrase(samples, count, rng, paraphraser)
        elif name == "near_dup":
            block = _near_dup(samples, count, rng)
        elif name == "tenants":
            block = _tenants(samples, count, tenants, rng)
        else:
            block = _restart(samples, count, out, rng)
        out.extend(block)
    return [dataclasses.replace(req, index=i) for i, req in enumerate(out)]


def describe(requests: Sequence[BenchRequest]) -> dict[str, int]:
    """Number of requests per workload, in order of first appearance."""
    return dict(Counter(req.workload for req in requests))
