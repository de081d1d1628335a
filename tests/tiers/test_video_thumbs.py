"""A clip's thumbnails made in the background or as needed are the same bytes."""

import time

import numpy as np

from vlmcache.testing.clips import synthetic_frames
from vlmcache.tiers.video_thumbs import (COARSE_FRAMES, FrameThumbs, coarse_indices,
                                         frame_thumbnails, video_thumbnails)


def test_thumbnails_made_in_chunks_on_threads_equal_one_stack():
    """A long clip's thumbnails are made on the verifier's threads; the same bytes."""
    frames = np.random.default_rng(0).integers(0, 256, (33, 40, 56, 3), dtype=np.uint8)
    assert np.array_equal(video_thumbnails(frames), frame_thumbnails(frames))


def test_some_frames_first_then_all_are_the_whole_clips_bytes():
    frames = synthetic_frames(5, n=40, h=72, w=96)
    whole = video_thumbnails(frames)
    lazy = FrameThumbs.from_frames(frames)
    assert lazy.shape == whole.shape and lazy.nbytes == whole.nbytes and len(lazy) == 40
    assert np.array_equal(lazy.take([0, 20, 39]), whole[[0, 20, 39]])
    assert np.array_equal(lazy.take([39, 3]), whole[[39, 3]])  # any order, repeats
    assert np.array_equal(lazy.all(), whole) and np.array_equal(lazy[7], whole[7])
    assert np.array_equal(lazy.take([1, 2]), whole[[1, 2]])  # after all(): from the whole


def test_only_a_lookups_frames_start_before_the_whole_is_asked_for(monkeypatch):
    """The rest would run beside vLLM's own preparation of the request (its API server's
    GIL); they start when the clip is recorded or verified whole."""
    import vlmcache.tiers.video_thumbs as vt

    made = []
    real = vt.frame_thumbnails
    monkeypatch.setattr(vt, "frame_thumbnails", lambda chunk: made.append(len(chunk))
                        or real(chunk))
    frames = synthetic_frames(6, n=24, h=64, w=64)
    lazy = FrameThumbs.from_frames(frames)
    first = vt.lookup_indices(24)
    assert np.array_equal(lazy.take(first[:3]), real(frames[first[:3]]))
    time.sleep(0.2)
    assert made == [len(first)] and lazy._frames is not None
    assert np.array_equal(lazy.all(), real(frames)) and sum(made) == 24
    assert lazy._frames is None  # made whole: the frames are let go


def test_the_whole_asked_for_from_two_threads_is_made_once():
    from concurrent.futures import ThreadPoolExecutor

    frames = synthetic_frames(8, n=40, h=64, w=64)
    lazy = FrameThumbs.from_frames(frames)
    with ThreadPoolExecutor(4) as threads:
        wholes = list(threads.map(lambda _: lazy.all(), range(4)))
    assert all(w is wholes[0] for w in wholes)
    assert np.array_equal(wholes[0], video_thumbnails(frames))


def test_a_failed_background_job_is_made_again_on_the_asking_thread(monkeypatch):
    import vlmcache.tiers.video_thumbs as vt

    frames = synthetic_frames(7, n=16, h=64, w=64)
    whole = video_thumbnails(frames)
    real = vt.frame_thumbnails
    calls = []

    def flaky(chunk):
        calls.append(len(chunk))
        if len(calls) == 1:
            raise RuntimeError("injected")
        return real(chunk)

    monkeypatch.setattr(vt, "frame_thumbnails", flaky)
    lazy = FrameThumbs.from_frames(frames)
    assert np.array_equal(lazy.all(), whole)


def test_coarse_frames_are_evenly_spaced_and_include_both_ends():
    assert coarse_indices(5) == [0, 1, 2, 3, 4]
    picked = coarse_indices(60)
    assert len(picked) == COARSE_FRAMES and picked[0] == 0 and picked[-1] == 59
