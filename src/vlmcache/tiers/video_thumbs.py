"""A clip's verifier thumbnails, made off the request's path where they can be.

The near-duplicate tier verifies a video on 64 px thumbnails of its sampled frames; a
60-frame clip's thumbnails cost about as much as decoding it (~25 ms on two cores). A
lookup needs only a few: the coarse order (:data:`COARSE_FRAMES` frames) and the probes; all
of them only when a candidate passes its probes (a near-duplicate: then the whole clip is
verified) or when the clip is recorded as canonical, after the engine answered.
:class:`FrameThumbs` starts the lookup's few on a background thread as soon as the frames
are decoded, and the rest when the whole is first asked for. Made at decode, the rest ran
on threads of vLLM's API-server process while vLLM prepared the same request, and took
the GIL from it: on an H200 a 60-frame miss was 1.11x plain with them and 0.98x without
(``results/video.json``, ``qwen2vl7b-h200-handoff`` / ``-nothumbs``).

The thumbnails are the same bytes either way: each frame's thumbnail depends on that
frame alone (``tests/tiers/test_video_thumbs.py``).
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Sequence

import numpy as np

import vlmcache.cpu_share as cpu_share

logger = logging.getLogger(__name__)

#: Threads that compare or thumbnail a clip's frames (at most the machine's cores), each
#: given at least ``MIN_FRAMES_PER_THREAD`` frames: fewer do not pay for the hand-over.
MAX_VERIFY_THREADS = 8
MIN_FRAMES_PER_THREAD = 8
#: Frames (evenly spaced) whose block means order a lookup's candidates.
COARSE_FRAMES = 8
_POOLS: dict[str, ThreadPoolExecutor] = {}
_POOL_LOCK = threading.Lock()


def pool_size() -> int:
    return max(1, min(MAX_VERIFY_THREADS, os.cpu_count() or 1))


def pool(name: str = "verify") -> ThreadPoolExecutor:
    """The process's verifier threads (``verify``), or the background thumbnail threads
    (``thumbs``: a job there never waits on another pool's work, so neither can starve)."""
    with _POOL_LOCK:
        if name not in _POOLS:
            _POOLS[name] = ThreadPoolExecutor(pool_size(), thread_name_prefix=f"vlmcache-{name}",
                                              initializer=cpu_share.thread_initializer())
        return _POOLS[name]


class FrameThumbs:
    """``(T, 3, 64, 64)`` uint8 thumbnails of a clip's frames, whole or made as needed.

    :meth:`ready` wraps thumbnails already made; :meth:`from_frames` starts a lookup's few
    in the background and holds the frames until the whole is made. :meth:`take` gives
    some frames' (the first job's when it made them), :meth:`start_rest` starts the rest
    (in chunks on the thumbnail threads), :meth:`all` every frame's (waiting for them)."""

    def __init__(self, count: int, thumbs: np.ndarray | None = None,
                 frames: Any = None) -> None:
        self.count = count
        self._thumbs = thumbs
        self._frames = frames
        self._jobs: list[Future[np.ndarray]] = []
        self._parts: list[list[int]] = []  # the frames each job makes
        self._rest: list[list[int]] = []  # parts not started yet
        self._lock = threading.Lock()

    @classmethod
    def ready(cls, thumbs: np.ndarray) -> "FrameThumbs":
        return cls(len(thumbs), thumbs=np.asarray(thumbs))

    @classmethod
    def from_frames(cls, frames: Any) -> "FrameThumbs":
        """Start the thumbnails a lookup reads of ``frames`` (:func:`lookup_indices`); the
        rest wait for :meth:`all`."""
        frames = np.asarray(frames)  # (T, H, W, 3): the jobs index it by frame lists
        out = cls(len(frames), frames=frames)
        first = lookup_indices(len(frames))
        chosen = set(first)
        rest = [i for i in range(len(frames)) if i not in chosen]
        out._rest = [part for part in (rest[a:b] for a, b in _chunks(len(rest))) if part]
        if first:
            out._submit(first)
        return out

    def _submit(self, part: list[int]) -> None:
        assert self._frames is not None
        job = pool("thumbs").submit(frame_thumbnails, self._frames[part])
        self._parts.append(part)
        self._jobs.append(job)

    def start_rest(self) -> None:
        """Start the frames a lookup did not need, in the background (the request that
        decoded the clip is done with the engine's preparation); the last job to finish
        lets the frames go. Idempotent."""
        with self._lock:
            if self._thumbs is not None or not self._rest:
                return
            for part in self._rest:
                self._submit(part)
            self._rest = []
            jobs = list(self._jobs)
        for job in jobs:
            job.add_done_callback(self._job_done)

    def _job_done(self, _: "Future[np.ndarray]") -> None:
        with self._lock:
            if self._thumbs is not None or self._rest:
                return
            parts, jobs = list(self._parts), list(self._jobs)
        if not all(job.done() for job in jobs) or \
                any(job.exception() is not None for job in jobs):
            return  # not the last, or one failed: all() makes them again
        self._made(self._assembled(parts, jobs))

    def _made(self, thumbs: np.ndarray) -> np.ndarray:
        """The whole clip's thumbnails, kept (the first made wins); the frames let go."""
        with self._lock:
            if self._thumbs is None:
                self._thumbs, self._frames = thumbs, None
                self._parts, self._jobs = [], []
            return self._thumbs

    @property
    def shape(self) -> tuple[int, int, int, int]:
        return (self.count, 3, 64, 64)

    @property
    def nbytes(self) -> int:
        return self.count * 3 * 64 * 64

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, index: Any) -> np.ndarray:
        return self.all()[index]

    def take(self, indices: Sequence[int]) -> np.ndarray:
        """The thumbnails of ``indices`` (``(len(indices), 3, 64, 64)``): from the first
        background job when it makes them all (a lookup's frames), else from the whole."""
        with self._lock:
            first = (self._parts[0], self._jobs[0]) if self._thumbs is None and self._parts \
                else None
        if first is not None and {int(i) for i in indices} <= set(first[0]):
            try:
                made = dict(zip(first[0], first[1].result()))
                return np.stack([made[int(i)] for i in indices])
            except Exception:  # noqa: BLE001 -- all() makes them again
                logger.exception("video thumbnails: background job failed")
        return self.all()[list(indices)]

    def all(self) -> np.ndarray:
        """Every frame's thumbnail (starts the rest and waits for them)."""
        self.start_rest()
        with self._lock:
            if self._thumbs is not None:
                return self._thumbs
            parts, jobs, frames = list(self._parts), list(self._jobs), self._frames
        try:
            thumbs = self._assembled(parts, jobs)
        except Exception:  # noqa: BLE001 -- a background failure: made again here
            logger.exception("video thumbnails: background job failed")
            thumbs = frame_thumbnails(frames)  # held until the thumbnails are made
        return self._made(thumbs)

    def _assembled(self, parts: list[list[int]], jobs: list["Future[np.ndarray]"]
                   ) -> np.ndarray:
        """The jobs' thumbnails in frame order (raises what a job raised)."""
        out = np.empty(self.shape, np.uint8)
        for part, job in zip(parts, jobs):
            out[part] = job.result()
        return out


def _chunks(count: int) -> list[tuple[int, int]]:
    n = max(1, min(pool_size(), count // MIN_FRAMES_PER_THREAD))
    bounds = np.linspace(0, count, n + 1).astype(int)
    return list(zip(bounds[:-1].tolist(), bounds[1:].tolist()))


def probe_indices(count: int) -> list[int]:
    """The frames a candidate is probed on first: the first, the middle and the last."""
    return sorted({0, count // 2, count - 1}) if count else []


def lookup_indices(count: int) -> list[int]:
    """The frames a lookup reads of a query clip: the coarse order's and the probes'."""
    return sorted(set(coarse_indices(count)) | set(probe_indices(count)))


def coarse_indices(count: int) -> list[int]:
    """The frames whose block means order candidates: ``COARSE_FRAMES`` evenly spaced."""
    if count <= COARSE_FRAMES:
        return list(range(count))
    return sorted({int(round(x)) for x in np.linspace(0, count - 1, COARSE_FRAMES)})


def video_thumbnails(frames: Any) -> np.ndarray:
    """``(T, 3, 64, 64)`` uint8 verifier thumbnails of ``(T, H, W, 3)`` frames: each frame
    as :func:`~vlmcache.tiers.verify.thumbnail` makes it, the blur run on a stack of frames
    at once (a third of the cost of 60 frames one by one), stacks in chunks on the
    verifier's threads (PIL's resize and numpy let go of the GIL)."""
    chunks = _chunks(len(frames))
    if len(chunks) == 1:
        return frame_thumbnails(frames)
    return np.concatenate(list(pool().map(frame_thumbnails, [frames[a:b] for a, b in chunks])))


def frame_thumbnails(frames: Any) -> np.ndarray:
    """:func:`video_thumbnails` on the calling thread."""
    from PIL import Image

    from vlmcache.tiers.verify import SIZE
    from vlmcache.tiers.verify_batch import _box

    small = np.stack([np.asarray(Image.fromarray(np.asarray(f)).convert("RGB")
                                 .resize((SIZE, SIZE), Image.BOX), dtype=np.float32)
                      for f in frames])
    blurred = _box(small.transpose(0, 3, 1, 2), 3)
    return np.clip(blurred, 0, 255).round().astype(np.uint8)
