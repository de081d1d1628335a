"""The verifier's aligned distance for a stack of frame pairs at once.

:func:`~vlmcache.tiers.verify.aligned_distance` compares one pair of thumbnails in about
3 ms, almost all of it numpy's per-call overhead on 64 x 64 arrays: a 60-frame clip cost
180 ms to verify. :func:`aligned_distances` computes the same distance (the same terms,
the same gain fit, the same colour map and shade) for every pair along a leading frame
axis in one pass. ``tests/tiers/test_verify_batch.py`` holds it equal to the per-pair function,
which stays the reference: a change to one must be made to both.
"""

from __future__ import annotations

from typing import Iterator

import numpy as np

from vlmcache.tiers.verify import (
    _BOX,
    _YCC,
    CAST_WEIGHT,
    CHROMA_WEIGHT,
    COLOUR_MAP_WEIGHT,
    DECOLOUR_WEIGHT,
    FOREGROUND_LEVEL,
    GAIN_MAX,
    GAIN_MIN,
    GREY_MAX,
    LUMA_WEIGHT,
    SHADE_CORE,
    SHADE_MAX_SHARE,
    SIZE,
    TINT_WEIGHT,
)


def aligned_distances(query: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """``(T,)`` distances of ``(T, 3, 64, 64)`` thumbnail stacks, pair ``i`` as
    :func:`~vlmcache.tiers.verify.aligned_distance` ``(query[i], cand[i])``."""
    worst = np.maximum.reduce(list(_terms(query, cand)))
    return np.minimum(1.0, worst / 255.0)


def any_exceeds(query: np.ndarray, cand: np.ndarray, threshold: float) -> bool:
    """``aligned_distances(query, cand).max() > threshold``, the terms taken cheapest first
    and the first that puts a pair over ``threshold`` ending it (a refused candidate's
    probe frames pay for its cast, not for all six terms)."""
    for term in _terms(query, cand):
        if bool((np.minimum(1.0, term / 255.0) > threshold).any()):
            return True
    return False


def _terms(query: np.ndarray, cand: np.ndarray) -> Iterator[np.ndarray]:
    """The distance's terms per pair (levels, weighted; the module docstring of
    :mod:`~vlmcache.tiers.verify`), cheapest first."""
    q, c = query.astype(np.float32), cand.astype(np.float32)
    moved = np.pad(c, ((0, 0), (0, 0), (1, 1), (1, 1)), mode="edge")
    fitted = _exposed(q, moved)
    inner = fitted[:, :, 1:-1, 1:-1]
    rest = q - inner
    yield CAST_WEIGHT * np.median(np.abs(rest).max(axis=1).reshape(len(q), -1), axis=1)
    chroma = _YCC[1:] @ rest.reshape(len(q), 3, -1)
    yield TINT_WEIGHT * np.abs(np.median(chroma, axis=2)).max(axis=1)
    yield _shading(q, inner)
    yield _decolouring(q, inner)
    yield COLOUR_MAP_WEIGHT * np.maximum(_recolouring(q, inner), _recolouring(inner, q))
    ql, fl = _luma_chroma(q), _luma_chroma(fitted)
    there = np.pad(ql, ((0, 0), (0, 0), (1, 1), (1, 1)), mode="edge")
    diff = np.maximum(_nearest(ql, fl), _nearest(fl[:, :, 1:-1, 1:-1], there))
    diff[:, 0], diff[:, -1] = diff[:, 1], diff[:, -2]  # the edge ring (verify._inner_ring)
    diff[:, :, 0], diff[:, :, -1] = diff[:, :, 1], diff[:, :, -2]
    yield _box(diff, _BOX).reshape(len(q), -1).max(axis=1)


def _decolouring(query: np.ndarray, fitted: np.ndarray) -> np.ndarray:
    """Per pair: :func:`~vlmcache.tiers.verify._decolouring`."""
    low, high = np.sort(np.stack([_colourfulness(query), _colourfulness(fitted)]), axis=0)
    return np.where(low <= GREY_MAX, DECOLOUR_WEIGHT * np.maximum(0.0, high - GREY_MAX), 0.0)


def _colourfulness(rgb: np.ndarray) -> np.ndarray:
    """Per frame: the largest mean |Cb| or |Cr| of a 5x5 window (edges repeated)."""
    n = len(rgb)
    chroma = np.abs(_YCC[1:] @ rgb.reshape(n, 3, -1)).reshape(n, 2, SIZE, SIZE)
    r = _BOX // 2
    pad = np.pad(chroma, ((0, 0), (0, 0), (r, r), (r, r)), mode="edge")
    rows = sum(pad[:, :, k:k + SIZE] for k in range(_BOX))
    sums = sum(rows[:, :, :, k:k + SIZE] for k in range(_BOX))
    return sums.reshape(n, -1).max(axis=1) / (_BOX * _BOX)


def _exposed(query: np.ndarray, moved: np.ndarray) -> np.ndarray:
    """Per pair: ``moved`` under the one gain (through black) that best matches ``query``,
    fitted on unsaturated query values (all of them where fewer than 65 are), clipped."""
    n = len(query)
    q = query.reshape(n, -1)
    c = np.ascontiguousarray(moved[:, :, 1:-1, 1:-1]).reshape(n, -1)
    keep = (q < 250) & (q > 5)
    keep[keep.sum(axis=1) <= 64] = True
    ck = np.where(keep, c, 0)
    energy = np.einsum("tp,tp->t", ck, ck, dtype=np.float64)
    cross = np.einsum("tp,tp->t", np.where(keep, q, 0), ck, dtype=np.float64)
    safe = energy > 1e-6
    gain = np.where(safe, np.clip(cross / np.where(safe, energy, 1.0), GAIN_MIN, GAIN_MAX), 1.0)
    out = gain.astype(np.float32)[:, None, None, None] * moved
    return np.clip(out, 0.0, 255.0, out=out)


def _shading(query: np.ndarray, fitted: np.ndarray) -> np.ndarray:
    """Per pair: :func:`~vlmcache.tiers.verify._shading`."""
    (a, ok_a), (b, ok_b) = _shade(query), _shade(fitted)
    return np.where(ok_a & ok_b, LUMA_WEIGHT * np.abs(a - b), 0.0)


def _shade(rgb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per frame: (the object core's mean luma, whether the frame is a small object on
    a plain background) as :func:`~vlmcache.tiers.verify._shade`."""
    n = len(rgb)
    border = np.concatenate([rgb[:, :, 0], rgb[:, :, -1], rgb[:, :, :, 0], rgb[:, :, :, -1]],
                            axis=2)
    dist = np.abs(rgb - np.median(border, axis=2)[:, :, None, None]).max(axis=1)
    share = (dist > FOREGROUND_LEVEL).reshape(n, -1).mean(axis=1)
    core = dist >= SHADE_CORE * dist.reshape(n, -1).max(axis=1)[:, None, None]
    luma = (_YCC[0] @ rgb.reshape(n, 3, -1)).reshape(n, SIZE, SIZE)
    count = np.maximum(core.reshape(n, -1).sum(axis=1), 1)
    mean = (luma * core).reshape(n, -1).sum(axis=1) / count
    return mean, (share > 0) & (share <= SHADE_MAX_SHARE)


def _recolouring(query: np.ndarray, fitted: np.ndarray) -> np.ndarray:
    """Per pair: the chroma change one global colour map explains
    (:func:`~vlmcache.tiers.verify._recolouring`)."""
    n = len(query)
    q, f = ((_YCC @ im.reshape(n, 3, -1)).astype(np.float64) for im in (query, fitted))
    w = (f * f).sum(axis=1) + 1.0  # (T, P)
    fw = f * w[:, None, :]
    gram = fw @ f.transpose(0, 2, 1)  # (T, 3, 3)
    rhs = fw @ q[:, 1:].transpose(0, 2, 1)  # (T, 3, 2)
    colour_map = np.linalg.pinv(gram) @ rhs
    moved = np.abs(colour_map.transpose(0, 2, 1) @ f - f[:, 1:]).max(axis=1)
    return (w * moved).sum(axis=1) / w.sum(axis=1)


def _luma_chroma(rgb: np.ndarray) -> np.ndarray:
    """``(T, 3, H, W)`` RGB -> weighted luma and 3x3-blurred weighted chroma."""
    ycc = (_YCC @ rgb.reshape(len(rgb), 3, -1)).reshape(rgb.shape)
    ycc[:, 0] *= LUMA_WEIGHT
    ycc[:, 1:] = CHROMA_WEIGHT * _box(ycc[:, 1:], 3)
    return ycc


def _box(arr: np.ndarray, k: int) -> np.ndarray:
    """Mean over k x k windows of the last two axes (same size, edges repeated)."""
    r = k // 2
    lead = ((0, 0),) * (arr.ndim - 2)
    pad = np.pad(arr, lead + ((r, r), (r, r)), mode="edge")
    c = np.cumsum(np.cumsum(pad, axis=-2), axis=-1)
    c = np.pad(c, lead + ((1, 0), (1, 0)))
    h, w = arr.shape[-2:]
    return (c[..., k:k + h, k:k + w] - c[..., :h, k:k + w] - c[..., k:k + h, :w]
            + c[..., :h, :w]) / (k * k)


def _nearest(image: np.ndarray, other_padded: np.ndarray) -> np.ndarray:
    """Per pixel of ``image`` ``(T, 3, H, W)``: the smallest largest-channel difference
    to a 3x3 neighbour in ``other_padded`` (a 1 px border larger)."""
    diff = np.full((image.shape[0],) + image.shape[2:], np.inf, np.float32)
    for oy in range(3):
        for ox in range(3):
            near = np.abs(image - other_padded[:, :, oy:oy + SIZE, ox:ox + SIZE]).max(axis=1)
            np.minimum(diff, near, out=diff)
    return diff
