"""Near-duplicate videos (a lossy re-encode, a resized copy): canonicalized only after
every frame is verified, in the same order and count.

A video's exact identity is its sampled frames (:func:`~vlmcache.keys.video_content_hash`);
this tier is asked only when that identity is new. A candidate is a canonical video of
the same tenant whose sampling matched (the same frame count and source frame indices,
and a frame rate within ``FPS_TOLERANCE``: a processor may read it). It is accepted when

1. every frame's verifier distance to the candidate's frame at the same index
   (:func:`~vlmcache.tiers.verify.aligned_distance`: pixel-aligned 64 px thumbnails, no
   registration search, since a re-encode does not move the picture) is at most the
   threshold: one changed frame, an object appearing in the last frame, or reversed
   frames fail it;
2. the frames are not better aligned one step off (frame i nearer the candidate's i+1
   or i-1, summed over the clip, on 16 px luma): a clip shifted by a whole sampling step
   fails it, where slow motion keeps each frame within the threshold of its neighbour;
3. no frame stands out: a codec or a resize treats every frame alike, so a frame whose
   distance exceeds the clip's median frame distance by more than ``FRAME_EXCESS_MAX``
   was edited on its own (an object in one frame that, faint, still passes the image
   threshold: a dark box on a dark background);
4. the frames are not the candidate's moved part of the way along in time
   (:func:`time_offset`): a clip that starts one source frame later (or earlier) is
   sampled between the candidate's frames, each frame within the threshold of the
   candidate's and nearer it than its neighbours when the camera or objects move slowly,
   yet its difference from each of the candidate's frames points along the clip's own
   motion toward the next (previous) frame. A re-encode's or resize's difference does not
   follow the motion.

A hit rewrites the request to the canonical clip's own bytes and identity: below this
tier the engine sees exactly the video the cached KV and encoder outputs were computed for.
Lookups have no side effects; :meth:`VideoTier.record` makes a served video canonical.
Memory is bounded (``budget_bytes``, least recently used out; one tenant may hold at most
half of it).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from vlmcache.tiers.verify import exposure_gain
from vlmcache.tiers.verify_batch import aligned_distances, any_exceeds
from vlmcache.tiers.video_thumbs import (MIN_FRAMES_PER_THREAD, FrameThumbs,  # noqa: F401
                                         coarse_indices, frame_thumbnails, pool, pool_size,
                                         probe_indices,
                                         video_thumbnails)

logger = logging.getLogger(__name__)

#: Frame rates (as containers state them) within this share count as one sampling.
FPS_TOLERANCE = 0.005
#: A clip is refused as shifted when one step off is nearer than this share of aligned
#: (a static clip is as near either way: shifting it changes nothing the model sees).
SHIFT_MARGIN = 0.5
#: The most one frame's distance may exceed the clip's median frame distance: re-encodes,
#: re-muxes, other codecs and resizes of the fidelity benchmark's train clips at most
#: 0.061; an object added to one frame at least 0.110.
FRAME_EXCESS_MAX = 0.085
#: A clip whose frames lie this far (a share of the step to the candidate's neighbouring
#: sampled frame) along the clip's motion, with at least ``TIME_OFFSET_CORRELATION`` of
#: its difference along it, is refused as moved in time: a one-frame shift with a frame
#: sampled every k is ~1/k of the way (k = 3 in the fidelity benchmark's clips: 0.23-0.38
#: measured on its train clips; re-encodes and resizes at most 0.05).
TIME_OFFSET_MAX = 0.12
TIME_OFFSET_CORRELATION = 0.3
#: Canonical videos verified per lookup (the nearest by coarse thumbnails first).
CANDIDATES = 4
#: A canonical video whose coarse block means (:func:`coarse_distance`: 0-255 levels, after
#: the verifier's brightness gain) lie further than this from the query's is refused
#: without probing a frame. On the fidelity benchmark's 20 train clips the verifier
#: accepted pairs at most 8.0 apart (gain, offset and limited-range edits; re-encodes and
#: resizes at most 1.7), while other clips lay at least 16.1 apart: a new clip's lookup
#: then costs the coarse order alone, the probes being what it paid on every candidate.
COARSE_REFUSE = 16.0


@dataclass(frozen=True)
class VideoSignature:
    """What the engine's sampling made of a video: frames taken, where from, how fast."""

    frames: int
    frame_indices: tuple[int, ...]
    fps: float

    def matches(self, other: "VideoSignature") -> bool:
        same_rate = abs(self.fps - other.fps) <= FPS_TOLERANCE * max(self.fps, other.fps, 1.0)
        return (self.frames, self.frame_indices) == (other.frames, other.frame_indices) \
            and same_rate


@dataclass(frozen=True)
class VideoQuery:
    """A video as this tier sees it: identity, sampling, per-frame thumbnails
    (``(T, 3, 64, 64)`` uint8, a :class:`~vlmcache.tiers.video_thumbs.FrameThumbs`; an
    array is wrapped) and the URL that carries its bytes."""

    content_hash: str
    signature: VideoSignature
    thumbs: FrameThumbs
    url: str

    def __post_init__(self) -> None:
        if not isinstance(self.thumbs, FrameThumbs):
            object.__setattr__(self, "thumbs", FrameThumbs.ready(np.asarray(self.thumbs)))

    @property
    def nbytes(self) -> int:
        return int(self.thumbs.nbytes) + len(self.url)

    @functools.cached_property
    def coarse(self) -> np.ndarray:
        """8x8 block means of ``COARSE_FRAMES`` evenly spaced frames (computed once: every
        lookup orders by it; a query's other thumbnails are not waited for)."""
        return _coarse(self.thumbs.take(coarse_indices(self.thumbs.count)))


@dataclass(frozen=True)
class VideoMatch:
    """A verified canonical video: its identity, URL, and the largest frame distance."""

    canonical_hash: str
    url: str
    distance: float


class VideoTier:
    """Canonical videos per tenant, with per-frame verification.

    Args:
        verify_threshold: the largest frame distance a candidate may have (the image
            tier's calibrated verifier threshold: the same verifier, per frame).
        budget_bytes: memory for canonical videos (thumbnails and URLs).
    """

    def __init__(self, verify_threshold: float, budget_bytes: int) -> None:
        self.verify_threshold = verify_threshold
        self.budget_bytes = budget_bytes
        self._entries: OrderedDict[tuple[str | None, str], VideoQuery] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def lookup(self, query: VideoQuery, tenant: str | None) -> VideoMatch | None:
        """The canonical video ``query`` is a verified near-duplicate of, or ``None``."""
        if (tenant, query.content_hash) in self._entries:
            return None  # itself canonical: nothing to rewrite
        cands = self._candidates(query, tenant)
        if not cands:
            return None
        probed = probe_passes(query.thumbs, [c.thumbs for c in cands], self.verify_threshold)
        for cand, passed in zip(cands, probed):
            if not passed:
                continue  # verify_frames would refuse it at the same probe
            distance = verify_frames(query.thumbs, cand.thumbs, self.verify_threshold)
            if distance is not None:
                return VideoMatch(cand.content_hash, cand.url, distance)
        return None

    def record(self, query: VideoQuery, tenant: str | None) -> bool:
        """Make ``query`` canonical for ``tenant`` (``False``: larger than a tenant's share)."""
        key = (tenant, query.content_hash)
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                return True
            if query.nbytes > self.budget_bytes // 2:
                return False
        query.thumbs.all()  # a canonical clip's thumbnails are kept whole, frames let go
        with self._lock:
            if key in self._entries:
                return True
            self._entries[key] = query
            self._bytes += query.nbytes
            self._evict(tenant)
        return True

    def __len__(self) -> int:
        return len(self._entries)

    def _candidates(self, query: VideoQuery, tenant: str | None) -> list[VideoQuery]:
        with self._lock:
            same = [e for (t, _), e in self._entries.items()
                    if t == tenant and e.signature.matches(query.signature)]
        same = [e for e in same if coarse_distance(query.coarse, e.coarse) <= COARSE_REFUSE]
        same.sort(key=lambda e: float(np.abs(e.coarse - query.coarse).mean()))
        return same[:CANDIDATES]

    def _evict(self, tenant: str | None) -> None:
        while self._tenant_bytes(tenant) > self.budget_bytes // 2:
            self._drop(next(k for k in self._entries if k[0] == tenant))
        while self._bytes > self.budget_bytes:
            self._drop(next(iter(self._entries)))

    def _tenant_bytes(self, tenant: str | None) -> int:
        return sum(e.nbytes for (t, _), e in self._entries.items() if t == tenant)

    def _drop(self, key: tuple[str | None, str]) -> None:
        self._bytes -= self._entries.pop(key).nbytes


Thumbs = FrameThumbs | np.ndarray


def _thumbs(thumbs: Thumbs) -> FrameThumbs:
    return thumbs if isinstance(thumbs, FrameThumbs) else FrameThumbs.ready(thumbs)


def _probe(query: Thumbs) -> list[int]:
    return probe_indices(len(query))


def probe_passes(query: Thumbs, cands: list[Thumbs], threshold: float) -> list[bool]:
    """Whether each candidate passes :func:`verify_frames`'s first test (same shape, its
    3 probe frames within ``threshold``), the candidates probed at once on the verifier's
    threads: on a miss every candidate is refused here (most at the cast, the first term
    of the distance), and only the probe frames' thumbnails are made."""
    query = _thumbs(query)
    q = query.take(_probe(query))

    def passes(cand: Thumbs) -> bool:
        cand = _thumbs(cand)
        if cand.shape != query.shape:
            return False
        return not any_exceeds(q, cand.take(_probe(cand)), threshold)

    if len(cands) <= 1:
        return [passes(c) for c in cands]
    return list(pool().map(passes, cands))


def verify_frames(query: Thumbs, cand: Thumbs, threshold: float) -> float | None:
    """The largest per-frame distance if every frame passes, none stands out, and the
    clip is neither better aligned one frame off nor moved in time (module docstring);
    ``None`` when the candidate is refused."""
    query, cand = _thumbs(query), _thumbs(cand)
    if query.shape != cand.shape:
        return None
    probe = _probe(query)  # another clip fails here, for 3 frames
    if any_exceeds(query.take(probe), cand.take(probe), threshold):
        return None
    q, c = query.all().astype(np.float32), cand.all().astype(np.float32)
    distances = frame_distances(q, c)
    worst = float(distances.max())
    if worst > threshold:
        return None
    if worst - float(np.median(distances)) > FRAME_EXCESS_MAX:
        return None  # one frame edited on its own
    if len(q) > 1:
        if shifted(q, c):
            return None
        share, correlation = time_offset(q, c)
        if share >= TIME_OFFSET_MAX and correlation >= TIME_OFFSET_CORRELATION:
            return None
    return worst


def frame_distances(query: np.ndarray, cand: np.ndarray) -> np.ndarray:
    """:func:`~vlmcache.tiers.verify_batch.aligned_distances` of every frame pair, in
    chunks on the verifier's threads (numpy lets go of the GIL inside each stacked
    operation, so a long clip's frames are compared on several cores at once)."""
    chunks = max(1, min(pool_size(), len(query) // MIN_FRAMES_PER_THREAD))
    if chunks == 1:
        return aligned_distances(query, cand)
    bounds = np.linspace(0, len(query), chunks + 1).astype(int)
    parts = pool().map(aligned_distances, *zip(*[(query[a:b], cand[a:b])
                                                  for a, b in zip(bounds, bounds[1:])]))
    return np.concatenate(list(parts))


def shifted(query: np.ndarray, cand: np.ndarray) -> bool:
    """Whether the query's frames lie nearer the candidate's one step off than at their own
    index (mean absolute difference of 16 px luma, over the frames both alignments share):
    a cheap, vectorized test (the verifier's distance per pair cost 2 ms a frame)."""
    q, c = _luma16(query), _luma16(cand)
    aligned = np.abs(q - c).mean(axis=(1, 2))
    ahead = np.abs(q[:-1] - c[1:]).mean(axis=(1, 2)).sum()  # query frame i ~ cand i+1
    behind = np.abs(q[1:] - c[:-1]).mean(axis=(1, 2)).sum()  # query frame i+1 ~ cand i
    return bool(ahead < SHIFT_MARGIN * aligned[:-1].sum()
                or behind < SHIFT_MARGIN * aligned[1:].sum())


def _luma16(thumbs: np.ndarray) -> np.ndarray:
    """``(T, 16, 16)`` luma of ``(T, 3, 64, 64)`` thumbnails (4x4 block means)."""
    luma = 0.299 * thumbs[:, 0] + 0.587 * thumbs[:, 1] + 0.114 * thumbs[:, 2]
    n, h, w = luma.shape
    return luma.reshape(n, 16, h // 16, 16, w // 16).mean(axis=(2, 4))


def time_offset(query: np.ndarray, cand: np.ndarray) -> tuple[float, float]:
    """How far ``query``'s frames lie toward the candidate's next (or previous) frames.

    The difference ``query[i] - cand[i]`` is projected on the candidate's own step
    ``cand[i+1] - cand[i]`` (forward) or ``cand[i-1] - cand[i]`` (backward), over all
    frames at once: the least-squares share ``a`` of the step and the correlation of
    the difference with it. The larger share of the two directions is returned with its
    correlation. A clip started ``d`` source frames later with a frame sampled every
    ``k`` gives ``a`` about ``d/k``; codec or resampling errors do not follow the motion
    (``a`` and the correlation near 0). A static clip has no step: ``(0, 0)``.
    """
    q, c = query.astype(np.float64), cand.astype(np.float64)
    diff, step = q - c, c[1:] - c[:-1]
    best = (0.0, 0.0)
    for d, s in ((diff[:-1], step), (diff[1:], -step)):
        energy = float((s * s).sum())
        if energy < s.size:  # under one level per pixel per frame: nothing moves
            continue
        along = float((d * s).sum())
        share = along / energy
        correlation = along / np.sqrt(energy * max(float((d * d).sum()), 1e-9))
        if share > best[0]:
            best = (share, correlation)
    return best


def coarse_distance(query: np.ndarray, cand: np.ndarray) -> float:
    """Mean absolute difference of two clips' coarse block means after the one gain
    (through black, within the verifier's range) that best maps ``cand`` onto ``query``:
    a brightness change the verifier forgives does not push a candidate past
    :data:`COARSE_REFUSE`."""
    q, c = query.ravel(), cand.ravel()
    return float(np.abs(q - exposure_gain(q, c) * c).mean())


def _coarse(thumbs: np.ndarray) -> np.ndarray:
    """8x8 block means of every frame: a cheap order for the candidates."""
    t = thumbs.astype(np.float32)
    n, ch, h, w = t.shape
    return t.reshape(n, ch, 8, h // 8, 8, w // 8).mean(axis=(3, 5))


@dataclass(frozen=True)
class VideoCanon:
    """A request's videos after the tier: identities to send, canonical URLs where one was
    matched (``None``: as sent), each match's distance, and the tier's status."""

    hashes: tuple[str, ...]
    urls: tuple[str | None, ...]
    distances: tuple[float, ...]
    status: str  # "hit" | "miss" | "skip"

    @property
    def changed(self) -> bool:
        return self.status == "hit"


def canonical_videos(tier: VideoTier | None, queries: tuple[VideoQuery, ...],
                     hashes: tuple[str, ...], tenant: str | None) -> VideoCanon:
    """Each video replaced by the canonical one it verifies against, where there is one
    (no side effects). ``skip`` without the tier or videos."""
    if tier is None or not queries:
        return VideoCanon(hashes, (), (), "skip")
    matches = [tier.lookup(q, tenant) for q in queries]
    if not any(m is not None for m in matches):
        return VideoCanon(hashes, (), (), "miss")
    for q, m in zip(queries, matches):
        if m is not None:
            logger.info("video tier: %s canonicalized to %s (largest frame distance %.3f)",
                        q.content_hash[:16], m.canonical_hash[:16], m.distance)
    return VideoCanon(tuple(m.canonical_hash if m else q.content_hash
                            for q, m in zip(queries, matches)),
                      tuple(m.url if m else None for m in matches),
                      tuple(m.distance if m else 0.0 for m in matches), "hit")
