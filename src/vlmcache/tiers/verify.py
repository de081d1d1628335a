"""Verify an image-embedding candidate before canonicalizing to it.

An ANN hit only says two images look alike to an embedder; a VQA answer can hinge on what
embedders blur away (the shape's colour, a mirror, one more object). The verifier compares
small aligned RGB thumbnails:

1. both images -> 64x64 RGB thumbnails (area resampling, a 3x3 blur);
2. register the candidate onto the query: zoom (crops, rescales) and translation
   (shifts up to ``MAX_SHIFT`` px of 64), coarse to fine on grey images (16 px, 32, 64);
3. fit one brightness gain and offset shared by all channels, on unsaturated values,
   applied with clipping (re-exposure; it cannot turn red into blue: that needs a
   per-channel change);
4. the distance is the largest local colour difference: per pixel the largest channel
   difference to the best of the other image's 3x3 neighbours (both ways), averaged over
   5x5 windows (a misaligned edge averages away, an added, removed or recoloured object
   of more than a few px does not), or ``CAST_WEIGHT`` times the median pixel's
   difference (a colour cast over the whole image), in units of 255.

A candidate passes when that distance is at most the tier's verify threshold (calibrated
on the fidelity benchmark). Numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

SIZE = 64
MAX_SHIFT = 8
#: Candidate zooms (the candidate's central 1/z, resized back): crops of 95-100% of a side
#: and their inverses (the query is the wider view).
ZOOMS = (1.0, 1 / 0.975, 1 / 0.95, 0.95)
_BOX = 5
#: A colour cast over the whole image (the median pixel's difference) counts this much.
CAST_WEIGHT = 3.0


@dataclass(frozen=True)
class Verdict:
    """Registration found and the distance left (0 = identical, 1 = black vs white)."""

    distance: float
    dx: int
    dy: int
    zoom: float


@dataclass(frozen=True)
class Prepared:
    """One image as the verifier sees it: its thumbnail and, per zoom in ``ZOOMS``,
    zero-mean grey images at 16 and 32 px, edge-padded for the translation search."""

    thumb: np.ndarray  # (3, 64, 64) float32, 0-255 (channel-first: fast channel max)
    grey16: tuple[np.ndarray, ...]
    grey32: tuple[np.ndarray, ...]


_PAD16, _PAD32, _PAD64 = MAX_SHIFT // 4, MAX_SHIFT // 2 + 1, MAX_SHIFT + 2


def thumbnail(image: Any) -> np.ndarray:
    """``(3, 64, 64)`` float32 thumbnail (0-255), area-resampled and lightly blurred."""
    from PIL import Image

    rgb = image if image.mode == "RGB" else image.convert("RGB")
    arr = np.asarray(rgb.resize((SIZE, SIZE), Image.BOX), dtype=np.float32)
    return np.ascontiguousarray(_box(arr, 3).transpose(2, 0, 1))


def prepare(image: Any, zooms: Sequence[float] = ZOOMS) -> Prepared:
    """What :func:`verify` needs of an image (memoize it for cached images; a query
    needs only zoom 1: ``zooms=(1.0,)``)."""
    thumb = thumbnail(image)
    greys = [_grey(_zoomed(thumb, z)) for z in zooms]
    return Prepared(thumb, tuple(np.pad(_down(g, 4), _PAD16, mode="edge") for g in greys),
                    tuple(np.pad(_down(g, 2), _PAD32, mode="edge") for g in greys))


def verify(query: Prepared, candidate: Prepared, good_enough: float = 0.0) -> Verdict:
    """Register the candidate onto the query (zoom, then translation) and measure.

    Zoom 1 is registered (16, 32, then 64 px) and measured first; unless its distance is
    already at most ``good_enough``, every other zoom is registered at 16 and 32 px and
    the best of them (by the 32 px error) is refined and measured too.
    """
    q16 = query.grey16[0][_PAD16:-_PAD16, _PAD16:-_PAD16]
    q32 = query.grey32[0][_PAD32:-_PAD32, _PAD32:-_PAD32]
    grey_q = _grey(query.thumb)
    trials = []
    # ZOOMS[0] is 1: a candidate's views are in ZOOMS order, zoom 1 first
    for zoom, c16, c32 in zip(ZOOMS, candidate.grey16, candidate.grey32):
        _, dx, dy = _search(q16, c16, _PAD16, (0, 0), MAX_SHIFT // 4)
        err, dx, dy = _search(q32, c32, _PAD32, (2 * dx, 2 * dy), 1)
        trials.append((err, zoom, dx, dy))
        if zoom == 1.0:
            best = _refined(query.thumb, grey_q, candidate.thumb, zoom, dx, dy)
            if best.distance <= good_enough:
                return best
    others = [t for t in trials if t[1] != 1.0]
    if not others:  # a candidate prepared at zoom 1 only
        return best
    _, zoom, dx, dy = min(others)
    other = _refined(query.thumb, grey_q, candidate.thumb, zoom, dx, dy)
    return other if other.distance < best.distance else best


def _refined(query: np.ndarray, grey_q: np.ndarray, cand: np.ndarray, zoom: float,
             dx: int, dy: int) -> Verdict:
    """Translation refined at 64 px around the 32 px estimate, then the distance."""
    rgb = _zoomed(cand, zoom)
    grey = np.pad(_grey(rgb), _PAD64, mode="edge")
    _, dx, dy = _search(grey_q, grey, _PAD64, (2 * dx, 2 * dy), 2)
    dx, dy = (int(np.clip(d, -MAX_SHIFT, MAX_SHIFT)) for d in (dx, dy))
    return Verdict(_distance(query, rgb, dx, dy), dx, dy, zoom)


def _grey(rgb: np.ndarray) -> np.ndarray:
    """Channel mean minus its image mean (registration ignores a brightness offset)."""
    grey = rgb.mean(axis=0)
    return grey - grey.mean()


def _box(arr: np.ndarray, k: int) -> np.ndarray:
    """Mean over k x k windows (same size, edges repeated)."""
    r = k // 2
    pad = np.pad(arr, ((r, r), (r, r)) + ((0, 0),) * (arr.ndim - 2), mode="edge")
    c = np.cumsum(np.cumsum(pad, axis=0), axis=1)
    c = np.pad(c, ((1, 0), (1, 0)) + ((0, 0),) * (arr.ndim - 2))
    h, w = arr.shape[:2]
    return (c[k:k + h, k:k + w] - c[:h, k:k + w] - c[k:k + h, :w] + c[:h, :w]) / (k * k)


def _zoomed(thumb: np.ndarray, zoom: float) -> np.ndarray:
    """Zoom (3, H, W) about the centre, bilinear (>1 crops in, <1 shows more)."""
    if zoom == 1.0:
        return thumb
    centre = (SIZE - 1) / 2
    pos = np.clip(centre + (np.arange(SIZE) - centre) / zoom, 0, SIZE - 1)
    lo = np.floor(pos).astype(int)
    hi = np.minimum(lo + 1, SIZE - 1)
    w = (pos - lo).astype(np.float32)
    rows = thumb[:, lo] * (1 - w)[None, :, None] + thumb[:, hi] * w[None, :, None]
    return rows[:, :, lo] * (1 - w)[None, None, :] + rows[:, :, hi] * w[None, None, :]


def _down(grey: np.ndarray, f: int) -> np.ndarray:
    h = grey.shape[0] // f
    return grey.reshape(h, f, h, f).mean(axis=(1, 3))


def _search(query: np.ndarray, padded: np.ndarray, pad: int, centre: tuple[int, int],
            radius: int) -> tuple[float, int, int]:
    """Best (sum of abs diff, dx, dy) over shifts within ``radius`` of ``centre``;
    ``padded`` is the candidate with a ``pad``-px edge border."""
    cx, cy = (int(np.clip(c, radius - pad, pad - radius)) for c in centre)
    h, n = query.shape[0], 2 * radius + 1
    y0, x0 = pad - cy - radius, pad - cx - radius
    region = padded[y0:y0 + h + n - 1, x0:x0 + h + n - 1]
    windows = np.lib.stride_tricks.sliding_window_view(region, (h, h))
    errs = np.abs(windows - query).sum(axis=(2, 3))
    iy, ix = np.unravel_index(int(errs.argmin()), errs.shape)
    # window (iy, ix) starts at padded row y0 + iy == pad - dy
    return float(errs[iy, ix]), pad - x0 - int(ix), pad - y0 - int(iy)


def _distance(query: np.ndarray, cand: np.ndarray, dx: int, dy: int) -> float:
    """Largest 5x5-window colour difference after a shared gain/offset, over the whole
    query: where the shifted candidate has no pixels its edge repeats, so content that
    entered or left the frame counts as a difference (a miss, never a wrong answer).

    Each pixel is compared with the best of the other image's 3x3 neighbours, both ways
    (sub-pixel misregistration costs nothing; a thin object added or removed still does).
    """
    pad = MAX_SHIFT + 1
    padded = np.pad(cand, ((0, 0), (pad, pad), (pad, pad)), mode="edge")
    moved = padded[:, pad - dy - 1:pad - dy + SIZE + 1, pad - dx - 1:pad - dx + SIZE + 1]
    q, c = query.reshape(-1), moved[:, 1:-1, 1:-1].reshape(-1)
    keep = (q < 250) & (q > 5)  # fit on unsaturated values: brightening clips at 255
    q, c = (q[keep], c[keep]) if keep.sum() > 64 else (q, c)
    var = float(c.var())
    gain = float(np.clip(((q - q.mean()) * (c - c.mean())).mean() / var, 0.7, 1.45)) \
        if var > 1e-6 else 1.0
    offset = float(np.clip(q.mean() - gain * c.mean(), -40.0, 40.0))
    fitted = np.clip(gain * moved + offset, 0.0, 255.0)
    there = np.pad(query, ((0, 0), (1, 1), (1, 1)), mode="edge")
    diff = np.maximum(_nearest(query, fitted), _nearest(fitted[:, 1:-1, 1:-1], there))
    local = float(_box(diff, _BOX).max())
    cast = float(np.median(np.abs(query - fitted[:, 1:-1, 1:-1]).max(axis=0)))
    return max(local, CAST_WEIGHT * cast) / 255.0


def _nearest(image: np.ndarray, other_padded: np.ndarray) -> np.ndarray:
    """Per pixel of ``image`` (3, H, W): the smallest largest-channel difference to a 3x3
    neighbour in ``other_padded`` (``image``'s size plus a 1 px border)."""
    diff = np.full(image.shape[1:], np.inf, np.float32)
    for oy in range(3):
        for ox in range(3):
            near = np.abs(image - other_padded[:, oy:oy + SIZE, ox:ox + SIZE])
            np.minimum(diff, np.maximum(np.maximum(near[0], near[1]), near[2]), out=diff)
    return diff
