"""The front's decode of a clip handed to vLLM's own loader: the engine decodes it once."""

import numpy as np
import pytest

from vlmcache.testing.clips import synthetic_frames, write_clip
from vlmcache.vllm import video_handoff, video_io
from vlmcache.vllm.video_handoff import ClipHandoff

pytest.importorskip("cv2")


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _frames(n: int = 2) -> np.ndarray:
    return np.zeros((n, 4, 4, 3), np.uint8)  # 48 bytes a frame


def test_a_kept_clip_is_taken_as_copies_while_it_is_kept():
    handoff = ClipHandoff(10_000, 30.0)
    frames = _frames()
    assert handoff.put(b"k", frames, {"fps": 2.0})
    got, meta = handoff.take(b"k")
    assert got is not frames and np.array_equal(got, frames) and meta == {"fps": 2.0}
    got[:] = 7  # what the engine does to its frames never reaches the kept ones
    again, _ = handoff.take(b"k")
    assert np.array_equal(again, frames) and not again.any()
    assert handoff.nbytes == frames.nbytes and handoff.taken == 2


def test_kept_clips_leave_by_age_and_by_the_byte_budget():
    clock = _Clock()
    handoff = ClipHandoff(2 * 96, 30.0, clock)  # two 2-frame clips fit
    handoff.put(b"a", _frames(), {})
    clock.now = 10
    handoff.put(b"b", _frames(), {})
    clock.now = 20
    handoff.put(b"c", _frames(), {})  # over budget: the oldest (a) leaves
    assert handoff.take(b"a") is None and handoff.nbytes == 2 * 96
    clock.now = 41  # b is 31 s old
    assert handoff.take(b"b") is None
    assert handoff.take(b"c") is not None and handoff.nbytes == 96
    clock.now = 70  # c was used at 41: 29 s ago, still kept
    assert handoff.take(b"c") is not None
    clock.now = 101
    assert handoff.take(b"c") is None and handoff.nbytes == 0
    assert not handoff.put(b"big", _frames(100), {})  # alone over the budget: not kept


def test_the_least_recently_used_clip_leaves_first():
    handoff = ClipHandoff(2 * 96, 30.0, _Clock())
    handoff.put(b"a", _frames(), {})
    handoff.put(b"b", _frames(), {})
    handoff.take(b"a")  # a used since b was kept
    handoff.put(b"c", _frames(), {})
    assert handoff.take(b"b") is None and handoff.take(b"a") is not None


@pytest.fixture
def installed():
    assert video_handoff.install(64 * 1024**2, 30.0)
    yield video_handoff.current()
    video_handoff.uninstall()


def _clip(seed: int = 3) -> bytes:
    return write_clip(None, synthetic_frames(seed, n=8, h=48, w=64), 4.0, "mp4v")


def _engine_decode(data: bytes, sampling, kwargs):
    """What vLLM's media connector does with a clip: its own VideoMediaIO, another thread."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        return pool.submit(video_io.load_video, data, sampling, kwargs).result()


def test_the_engines_decode_takes_the_fronts_frames(installed):
    sampling = video_io.VideoSampling({"video": {"num_frames": 4}})
    kwargs = video_io.video_kwargs(sampling, None)
    data = _clip()
    frames, meta = video_io.load_video(data, sampling, kwargs, keep=True)
    taken_frames, taken_meta = _engine_decode(data, sampling, kwargs)
    assert np.array_equal(taken_frames, frames) and taken_meta == meta
    assert installed.taken == 1 and installed.decoded == 0
    # a later question on the same clip: the engine's loader is served again, not decoding
    again, _ = _engine_decode(data, sampling, kwargs)
    assert again is not taken_frames and np.array_equal(again, frames)
    assert installed.taken == 2 and installed.decoded == 0 and installed.nbytes == frames.nbytes


def test_every_outcome_is_counted_and_observed():
    clock, seen = _Clock(), []
    handoff = ClipHandoff(2 * 96, 30.0, clock, observe=seen.append)
    handoff.put(b"a", _frames(), {})
    assert handoff.take(b"a") is not None
    handoff.put(b"b", _frames(), {})
    assert handoff.take(b"b", by_engine=False) is not None  # the front again: not taken
    handoff.note_decoded()
    clock.now = 31
    assert handoff.take(b"a") is None
    assert seen == ["kept", "taken", "kept", "decoded", "expired", "expired"]
    assert (handoff.kept, handoff.taken, handoff.expired, handoff.decoded) == (2, 1, 2, 1)


def test_an_observer_that_raises_costs_nothing():
    def broken(outcome: str) -> None:
        raise RuntimeError("metrics down")

    handoff = ClipHandoff(10_000, 30.0, observe=broken)
    assert handoff.put(b"k", _frames(), {}) and handoff.take(b"k") is not None
    assert (handoff.kept, handoff.taken) == (1, 1)


def test_the_engines_own_decodes_are_counted(installed):
    sampling = video_io.VideoSampling({"video": {"num_frames": 4}})
    kwargs = video_io.video_kwargs(sampling, None)
    data = _clip()
    _engine_decode(data, sampling, kwargs)  # nothing kept: the engine decodes
    video_io.load_video(data, sampling, kwargs, keep=True)
    _engine_decode(data, sampling, kwargs)  # takes the front's
    _engine_decode(data, sampling, kwargs)  # and again
    _engine_decode(_clip(4), sampling, kwargs)  # other bytes: decoded
    assert (installed.kept, installed.taken, installed.decoded) == (1, 2, 2)


def test_other_bytes_or_other_sampling_decode_as_before(installed):
    sampling = video_io.VideoSampling({"video": {"num_frames": 4}})
    kwargs = video_io.video_kwargs(sampling, None)
    data = _clip()
    frames, _ = video_io.load_video(data, sampling, kwargs, keep=True)
    other = video_io.video_kwargs(sampling, {"num_frames": 2})
    two, _ = _engine_decode(data, sampling, other)
    assert two.shape[0] == 2 and installed.taken == 0
    clip, _ = _engine_decode(_clip(4), sampling, kwargs)
    assert clip is not frames and installed.taken == 0


def test_uninstall_gives_vllm_its_loaders_back(installed):
    from vllm.multimodal.video import VIDEO_LOADER_REGISTRY

    assert all(getattr(c, "_vlmcache_handoff", False)
               for c in VIDEO_LOADER_REGISTRY.name2class.values())
    video_handoff.uninstall()
    assert not any(getattr(c, "_vlmcache_handoff", False)
                   for c in VIDEO_LOADER_REGISTRY.name2class.values())
    assert video_handoff.current() is None


def test_without_install_keeping_changes_nothing():
    sampling = video_io.VideoSampling({"video": {"num_frames": 4}})
    kwargs = video_io.video_kwargs(sampling, None)
    data = _clip()
    frames, _ = video_io.load_video(data, sampling, kwargs, keep=True)
    again, _ = _engine_decode(data, sampling, kwargs)
    assert again is not frames and video_handoff.current() is None
