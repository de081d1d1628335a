"""Verify an image-embedding candidate before canonicalizing to it.

An ANN hit only says two images look alike to an embedder; a VQA answer can hinge on what
embedders blur away (the shape's colour, a mirror, one more object). The verifier compares
small aligned RGB thumbnails:

1. both images -> 64x64 RGB thumbnails (area resampling, a 3x3 blur);
2. register the candidate onto the query: zoom (crops down to 90% of a side, rescales)
   and translation (shifts up to ``MAX_SHIFT`` px of 64), coarse to fine on grey images
   (16 px, 32, 64); zoom and translation are one mapping of the source, so a shifted,
   zoomed view shows the source's own pixels from outside the zoomed frame;
3. fit one brightness gain (at least ``GAIN_MIN``) shared by all channels, through
   black (no offset), on unsaturated values, applied with clipping (re-exposure scales
   light: it cannot turn red into blue, which needs a per-channel change, nor a black
   shape into a grey one, which needs an offset: with one, up to +40, a near-black
   triangle on a pale grey background was lifted onto a dark grey one on white);
4. both go to luma + chroma (YCbCr), the chroma blurred over 3x3 px and weighted
   ``CHROMA_WEIGHT``: JPEG keeps chroma at half resolution and quantizes it coarsely, so
   re-encoding smears and pales the colour of small shapes along their edges, while a
   recolour changes it over the whole object;
5. the distance is the largest of four terms, in units of 255:

   - the largest local difference: per pixel the largest luma/chroma difference to the
     best of the other image's 3x3 neighbours (both ways), averaged over 5x5 windows (a
     misaligned edge averages away, an added, removed or recoloured object of more than a
     few px does not);
   - ``CAST_WEIGHT`` times the median pixel's difference (a colour cast over the image);
   - ``TINT_WEIGHT`` times the median chroma difference (Cb or Cr): the image's colour
     balance. Noise averages out of a median, a brightness change is fitted away, and
     JPEG moves a flat colour's chroma by at most ~2 levels (its quantization step for
     the block mean, at quality 35); another picture of the same scene on a slightly
     different background, lighting or white balance moves it by more;
   - ``COLOUR_MAP_WEIGHT`` times the recolouring: the chroma change that one global
     colour map explains (the query's Cb/Cr fitted as a linear function of the
     candidate's Y, Cb, Cr), averaged over pixels weighted by their energy. Greyscale,
     saturation, white balance, tint, sepia or a hue turn move every coloured pixel the
     same way, where the medians see only the majority of pixels (a dark photograph's
     few bright objects) and signed medians cancel (a desaturated blue sky and green
     trees); noise, JPEG and resampling errors follow no global map and drop out;

6. a picture without colour is not one with colour: when one thumbnail has no colour
   (no 5x5 window's mean chroma above ``GREY_MAX``) the distance is at least
   ``DECOLOUR_WEIGHT`` times the other's most coloured 5x5 window's chroma above
   ``GREY_MAX`` (a muted shape against its greyscale copy differs by ~9-25 chroma
   levels, under the local term's reach; benign edits never remove all colour from a
   picture nor give a grey one more than noise);
7. an object keeps its shade: when both thumbnails are small objects on a plain
   background (foreground, away from the border colour, at most ``SHADE_MAX_SHARE`` of
   the frame), the distance is at least ``LUMA_WEIGHT`` times the difference of their
   object cores' mean luma (pixels at least ``SHADE_CORE`` of the largest distance from
   the border colour). The local term compares each pixel with its best 3x3 neighbour;
   on a blurred shape ~10 px across every core pixel lies within a pixel of the edge's
   ramp, which holds every shade, so a darker or lighter shape of that size (a
   greyscale black triangle against a grey one) passed it at 0.05-0.17;
8. an object may not leave the frame: if registration moves more than ``LOST_MAX`` of the
   candidate's foreground (pixels away from its border colour) outside the query's frame
   (a shape shifted or zoomed out of view, i.e. removed), the distance is 1.

A candidate passes when that distance is at most the tier's verify threshold (calibrated
on the fidelity benchmark's train images). Numpy only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import numpy as np

SIZE = 64
MAX_SHIFT = 8
#: Candidate zooms (the candidate's central 1/z, resized back): crops of 90-100% of a side,
#: and 95% the other way (the query is the wider view).
ZOOMS = (1.0, 1 / 0.975, 1 / 0.95, 1 / 0.925, 1 / 0.9, 0.95)
_BOX = 5
#: A colour cast over the whole image (the median pixel's difference) counts this much.
CAST_WEIGHT = 3.0
#: Chroma (Cb, Cr) differences count this much against luma: a pure hue change moves
#: chroma by about half of what it moves the largest RGB channel.
CHROMA_WEIGHT = 2.0
#: Luma differences count this much: a low-contrast grey object added (~50 levels) must
#: stand well above re-encoding errors, which are mostly chroma.
LUMA_WEIGHT = 1.5
#: The median chroma difference counts this much: 2 levels (about the most JPEG q35
#: moves a flat colour) give 0.16.
TINT_WEIGHT = 20.0
#: The recolouring (mean chroma levels moved by the fitted colour map) counts this much:
#: on the calibration's train images (one direction) benign edits moved at most ~2.7
#: levels (a brightening that clips a pale background white), photo-editor colour edits
#: at least ~2.9.
COLOUR_MAP_WEIGHT = 18.0
#: The smallest re-exposure gain: a 15% darkening needs 0.85 (train photographs' benign
#: variants fit 0.84-1.16). A one-hue picture (a red retina) has its channels at separate
#: levels, so a gain of ~0.7 with an offset (a flatter, darker picture) maps it, made
#: cooler, onto itself within a few levels: the shared map would mimic a white balance.
GAIN_MIN = 0.8
#: The largest re-exposure gain (a brightened copy).
GAIN_MAX = 1.45
#: A thumbnail whose most coloured 5x5 window has a mean chroma (Cb or Cr, levels) of at
#: most this has no colour: on the calibration's train images, greyscale copies and their
#: benign variants reach 4.7 (noise, sigma 6, on a 64 px picture), desaturated ones
#: (25-40%) start at 15.
GREY_MAX = 6.0
#: Against a colourless thumbnail, the other's colour above ``GREY_MAX`` counts this much.
DECOLOUR_WEIGHT = 10.0
#: An object's core: its pixels at least this share of the largest distance from the
#: border colour (a 3x3-blurred shape of ~10 px is mostly ramp; its core is the plateau).
SHADE_CORE = 0.8
#: The shade term reads pictures whose foreground covers at most this share of the frame
#: (small objects on a plain background; a photograph's "foreground" is most of it).
SHADE_MAX_SHARE = 0.25
#: The share of the candidate's foreground that may leave the query's frame.
LOST_MAX = 0.5
#: A pixel differing from the image's median border colour by more than this (0-255, any
#: channel) is foreground.
FOREGROUND_LEVEL = 24.0
_YCC = np.array([[0.299, 0.587, 0.114], [-0.1687, -0.3313, 0.5], [0.5, -0.4187, -0.0813]],
                dtype=np.float32)


@dataclass(frozen=True)
class Verdict:
    """Registration found and the distance left (0 = identical, 1 = black vs white)."""

    distance: float
    dx: int
    dy: int
    zoom: float


@dataclass(frozen=True)
class Prepared:
    """One image as the verifier sees it: its thumbnail, its foreground and, per zoom in
    ``ZOOMS``, zero-mean grey images at 16 and 32 px with a border for the translation
    search (the source's own pixels; its edge repeated only outside the source)."""

    thumb: np.ndarray  # (3, 64, 64) float32, 0-255 (channel-first: fast channel max)
    grey16: tuple[np.ndarray, ...]
    grey32: tuple[np.ndarray, ...]
    foreground: np.ndarray  # (64, 64) bool: away from the median border colour


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
    greys = [_grey_padded(thumb, z) for z in zooms]  # 64 px + _PAD64 each side
    edge = _PAD64 - 4 * _PAD16
    return Prepared(thumb, tuple(_down(g[edge:-edge, edge:-edge], 4) for g in greys),
                    tuple(_down(g, 2) for g in greys), _foreground(thumb))


def verify(query: Prepared, candidate: Prepared, good_enough: float = 0.0,
           refuse_above: float | None = None) -> Verdict:
    """Register the candidate onto the query (zoom, then translation) and measure.

    Zoom 1 is registered (16, 32, then 64 px) and measured first; unless its distance is
    already at most ``good_enough``, every other zoom is registered at 16 and 32 px and
    the best of them (by the 32 px error) is refined and measured too. With
    ``refuse_above`` (a lookup's threshold), a distance above it may be a lower bound
    (:func:`_distance`): whether it is above is exact, its value need not be.
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
            best = _refined(query.thumb, grey_q, candidate, zoom, dx, dy, refuse_above)
            if best.distance <= good_enough:
                return best
    others = [t for t in trials if t[1] != 1.0]
    if not others:  # a candidate prepared at zoom 1 only
        return best
    _, zoom, dx, dy = min(others)
    other = _refined(query.thumb, grey_q, candidate, zoom, dx, dy, refuse_above)
    return other if other.distance < best.distance else best


def aligned_distance(query: np.ndarray, candidate: np.ndarray) -> float:
    """The distance of two :func:`thumbnail` arrays as they lie (zoom 1, no shift): for
    frames of two encodings of one video, which a re-encode does not move."""
    return _distance(query, candidate, 1.0, 0, 0)


def _refined(query: np.ndarray, grey_q: np.ndarray, cand: Prepared, zoom: float,
             dx: int, dy: int, refuse_above: float | None = None) -> Verdict:
    """Translation refined at 64 px around the 32 px estimate, then the distance."""
    _, dx, dy = _search(grey_q, _grey_padded(cand.thumb, zoom), _PAD64, (2 * dx, 2 * dy), 2)
    dx, dy = (int(np.clip(d, -MAX_SHIFT, MAX_SHIFT)) for d in (dx, dy))
    if _lost(cand.foreground, zoom, dx, dy) > LOST_MAX:
        return Verdict(1.0, dx, dy, zoom)
    return Verdict(_distance(query, cand.thumb, zoom, dx, dy, refuse_above), dx, dy, zoom)


def _foreground(thumb: np.ndarray) -> np.ndarray:
    """Pixels away from the median border colour by more than ``FOREGROUND_LEVEL``."""
    border = np.concatenate([thumb[:, 0], thumb[:, -1], thumb[:, :, 0], thumb[:, :, -1]],
                            axis=1)
    background = np.median(border, axis=1)
    return np.abs(thumb - background[:, None, None]).max(axis=0) > FOREGROUND_LEVEL


def _lost(foreground: np.ndarray, zoom: float, dx: int, dy: int) -> float:
    """The share of ``foreground`` that zoom (about the centre) then shift put outside
    the frame: what the query cannot show, e.g. a shape moved out of view."""
    total = int(foreground.sum())
    if total == 0:
        return 0.0
    centre = (SIZE - 1) / 2
    pos = centre + (np.arange(SIZE) - centre) * zoom
    inside_y = np.abs(pos + dy - centre) <= centre + 0.5
    inside_x = np.abs(pos + dx - centre) <= centre + 0.5
    kept = int(foreground[inside_y][:, inside_x].sum())
    return 1.0 - kept / total


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


def _zoomed(thumb: np.ndarray, zoom: float, dx: int = 0, dy: int = 0,
            border: int = 0) -> np.ndarray:
    """(3, 64, 64) zoomed about the centre (>1 crops in, <1 shows more), then moved by
    (dx, dy), sampled bilinearly on the frame plus ``border`` px each side. One mapping
    from the source, so a move brings in the source's own pixels from outside the zoomed
    view; only outside the source does its edge repeat."""
    if zoom == 1.0 and dx == dy == border == 0:
        return thumb
    (ly, hy, wy), (lx, hx, wx) = (_taps(zoom, d, border) for d in (dy, dx))
    rows = thumb[:, ly] * (1 - wy)[None, :, None] + thumb[:, hy] * wy[None, :, None]
    return rows[:, :, lx] * (1 - wx)[None, None, :] + rows[:, :, hx] * wx[None, None, :]


def _taps(zoom: float, d: int, border: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bilinear taps (low, high, weight) of one axis of :func:`_zoomed`."""
    centre = (SIZE - 1) / 2
    out = np.arange(-border, SIZE + border)
    pos = np.clip(centre + (out - d - centre) / zoom, 0, SIZE - 1)
    lo = np.floor(pos).astype(int)
    return lo, np.minimum(lo + 1, SIZE - 1), (pos - lo).astype(np.float32)


def _grey_padded(thumb: np.ndarray, zoom: float) -> np.ndarray:
    """Grey of the zoomed thumbnail with a ``_PAD64``-px border of the source's own
    pixels, minus the frame's mean (for the translation search)."""
    grey = _zoomed(thumb.mean(axis=0, keepdims=True), zoom, border=_PAD64)[0]
    return grey - grey[_PAD64:-_PAD64, _PAD64:-_PAD64].mean()


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


def _distance(query: np.ndarray, cand: np.ndarray, zoom: float, dx: int, dy: int,
              refuse_above: float | None = None) -> float:
    """The largest of the local, cast, tint, recolouring, decolouring and shade terms
    (module docstring) after a shared gain, over the whole query: where the shifted
    candidate has no pixels its edge repeats, so content that entered the frame counts as a difference (a miss, never a
    wrong answer; content that left it is :func:`_lost`'s).

    Each pixel is compared with the best of the other image's 3x3 neighbours, both ways
    (sub-pixel misregistration costs nothing; a thin object added or removed still does).

    With ``refuse_above``, the terms are taken cheapest first and the first that puts the
    distance above it ends the computation: the value returned is then a lower bound of
    the distance, above ``refuse_above`` (a refusal either way; most candidates of a
    lookup that misses are refused by the cast, for a fifth of the full cost).
    """
    fitted = _exposed(query, _zoomed(cand, zoom, dx, dy, border=1))
    worst = 0.0
    for term in _terms(query, fitted):
        worst = max(worst, term)
        if refuse_above is not None and min(1.0, worst / 255.0) > refuse_above:
            break
    return min(1.0, worst / 255.0)


def _terms(query: np.ndarray, fitted: np.ndarray) -> Iterator[float]:
    """:func:`_distance`'s terms (levels, weighted), cheapest first."""
    inner = fitted[:, 1:-1, 1:-1]
    rest = query - inner
    yield CAST_WEIGHT * float(np.median(np.abs(rest).max(axis=0)))
    # the colour balance: median Cb / Cr difference (noise and small objects drop out)
    yield TINT_WEIGHT * float(np.abs(np.median(np.tensordot(_YCC[1:], rest, axes=(1, 0))
                                               .reshape(2, -1), axis=1)).max())
    yield _shading(query, inner)
    yield _decolouring(query, inner)
    # both ways: a grey candidate has no chroma for a map to move (a desaturated request
    # would pass against its greyscale copy), the request's colour seen from it does
    yield COLOUR_MAP_WEIGHT * max(_recolouring(query, inner), _recolouring(inner, query))
    luma_q, luma_f = _luma_chroma(query), _luma_chroma(fitted)
    there = np.pad(luma_q, ((0, 0), (1, 1), (1, 1)), mode="edge")
    diff = np.maximum(_nearest(luma_q, luma_f), _nearest(luma_f[:, 1:-1, 1:-1], there))
    yield float(_box(_inner_ring(diff), _BOX).max())


def _inner_ring(diff: np.ndarray) -> np.ndarray:
    """``diff`` with its outermost ring replaced by the ring inside it: the frame's edge
    row is where a shifted or cropped copy repeats its edge (2-3 px of a 256 px photograph
    is most of a 64 px thumbnail's edge row), while anything 2 px thick reaches row 1."""
    out = diff.copy()
    out[0], out[-1] = out[1], out[-2]
    out[:, 0], out[:, -1] = out[:, 1], out[:, -2]
    return out


def _colourfulness(rgb: np.ndarray) -> float:
    """The largest mean |Cb| or |Cr| (levels) of a 5x5 window (edges repeated, as
    :func:`_box`; five shifted sums each way: half its time on two channels)."""
    chroma = np.abs(np.tensordot(_YCC[1:], rgb, axes=(1, 0)))
    r = _BOX // 2
    pad = np.pad(chroma, ((0, 0), (r, r), (r, r)), mode="edge")
    rows = sum(pad[:, k:k + SIZE] for k in range(_BOX))
    return float(sum(rows[:, :, k:k + SIZE] for k in range(_BOX)).max()) / (_BOX * _BOX)


def _decolouring(query: np.ndarray, fitted: np.ndarray) -> float:
    """``DECOLOUR_WEIGHT`` times the more colourful image's colour above ``GREY_MAX`` when
    the other has none, else 0 (module docstring, 6)."""
    low, high = sorted((_colourfulness(query), _colourfulness(fitted)))
    return DECOLOUR_WEIGHT * max(0.0, high - GREY_MAX) if low <= GREY_MAX else 0.0


def _recolouring(query: np.ndarray, fitted: np.ndarray) -> float:
    """The mean chroma change (levels) that one global colour map explains: the query's
    Cb/Cr least-squares fitted as a linear function of the candidate's (Y, Cb, Cr), each
    pixel weighted by its energy (so a dark image's bright objects count, its black does
    not), and the fitted map's move away from the candidate's own chroma averaged with the
    same weights. Local errors (noise, codecs, edges) fit no global map and drop out;
    JPEG's chroma loss on small saturated objects over black (a night scene's lights)
    does look like a desaturation, so such copies can be refused (a miss, not a wrong
    answer)."""
    q, f = (np.tensordot(_YCC, im, axes=(1, 0)).reshape(3, -1).T.astype(np.float64)
            for im in (query, fitted))
    w = (f * f).sum(axis=1) + 1.0
    # normal equations of the weighted fit (3x3: cheap); lstsq copes with a flat image
    gram, rhs = (f * w[:, None]).T @ f, (f * w[:, None]).T @ q[:, 1:]
    colour_map = np.linalg.lstsq(gram, rhs, rcond=None)[0]
    moved = np.abs(f @ colour_map - f[:, 1:]).max(axis=1)
    return float((w * moved).sum() / w.sum())


def _exposed(query: np.ndarray, moved: np.ndarray) -> np.ndarray:
    """``moved`` under the one gain (all channels, through black) that best matches
    ``query``, fitted on unsaturated values (brightening clips at 255) and applied with
    clipping. No offset: re-exposure scales light and keeps black black, while lifting
    black turns a black shape grey (module docstring, 3)."""
    q, c = query.reshape(-1), moved[:, 1:-1, 1:-1].reshape(-1)
    keep = (q < 250) & (q > 5)
    q, c = (q[keep], c[keep]) if keep.sum() > 64 else (q, c)
    return np.clip(exposure_gain(q, c) * moved, 0.0, 255.0)


def exposure_gain(query: np.ndarray, moved: np.ndarray) -> float:
    """The one gain (through black, within ``GAIN_MIN``-``GAIN_MAX``) that best maps the
    flat values ``moved`` onto ``query`` (least squares); 1 for an all-black ``moved``."""
    energy = float(np.dot(moved, moved))
    if energy <= 1e-6:
        return 1.0
    return float(np.clip(np.dot(query, moved) / energy, GAIN_MIN, GAIN_MAX))


def _shade(rgb: np.ndarray) -> float | None:
    """The mean luma of a picture's object core: the pixels at least ``SHADE_CORE`` of
    the largest distance (any channel) from the median border colour; ``None`` when the
    picture is no small object on a plain background (no foreground, or more than
    ``SHADE_MAX_SHARE`` of the frame)."""
    border = np.concatenate([rgb[:, 0], rgb[:, -1], rgb[:, :, 0], rgb[:, :, -1]], axis=1)
    dist = np.abs(rgb - np.median(border, axis=1)[:, None, None]).max(axis=0)
    share = float((dist > FOREGROUND_LEVEL).mean())
    if share == 0.0 or share > SHADE_MAX_SHARE:
        return None
    core = dist >= SHADE_CORE * dist.max()
    return float(np.tensordot(_YCC[0], rgb, axes=(0, 0))[core].mean())


def _shading(query: np.ndarray, fitted: np.ndarray) -> float:
    """``LUMA_WEIGHT`` times the difference of the two object cores' shades (levels), 0
    unless both are small objects on a plain background (module docstring, 7)."""
    a, b = _shade(query), _shade(fitted)
    return LUMA_WEIGHT * abs(a - b) if a is not None and b is not None else 0.0


def _luma_chroma(rgb: np.ndarray) -> np.ndarray:
    """(3, H, W) RGB -> luma and weighted, 3x3-blurred chroma (see the module docstring)."""
    ycc = np.tensordot(_YCC, rgb, axes=(1, 0))
    ycc[0] *= LUMA_WEIGHT
    ycc[1:] = CHROMA_WEIGHT * _box(ycc[1:].transpose(1, 2, 0), 3).transpose(2, 0, 1)
    return ycc


def _nearest(image: np.ndarray, other_padded: np.ndarray) -> np.ndarray:
    """Per pixel of ``image`` (3, H, W): the smallest largest-channel difference to a 3x3
    neighbour in ``other_padded`` (``image``'s size plus a 1 px border)."""
    diff = np.full(image.shape[1:], np.inf, np.float32)
    for oy in range(3):
        for ox in range(3):
            near = np.abs(image - other_padded[:, oy:oy + SIZE, ox:ox + SIZE])
            np.minimum(diff, np.maximum(np.maximum(near[0], near[1]), near[2]), out=diff)
    return diff
