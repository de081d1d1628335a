"""The near-duplicate video tier: per-frame verification, same order and count."""

from __future__ import annotations

import numpy as np
import pytest

from vlmcache.testing.clips import synthetic_frames, write_clip
from vlmcache.tiers import calibration
from vlmcache.tiers.verify import aligned_distance
from vlmcache.tiers.video import (FRAME_EXCESS_MAX, VideoQuery, VideoSignature, VideoTier,
                                  canonical_videos, time_offset, video_thumbnails)
from vlmcache.vllm.video_io import VideoSampling, load_video

#: the shipped image-verifier calibration's pick (the cascade gives the video tier this one)
THRESHOLD = calibration.threshold("image_verify", None, 0.01)


def _query(frames: np.ndarray, codec: str = "ffv1", name: str = "a", n: int = 8) -> VideoQuery:
    data = write_clip(None, frames, 4.0, codec)
    decoded, meta = load_video(data, VideoSampling(), {"num_frames": n})
    sig = VideoSignature(len(decoded), tuple(meta["frames_indices"]), float(meta["fps"]))
    return VideoQuery(f"{name}-{codec}", sig, video_thumbnails(decoded), f"data:{name}")


@pytest.fixture(scope="module")
def clip() -> np.ndarray:
    return synthetic_frames(3, n=16)


@pytest.fixture
def tier(clip) -> VideoTier:
    tier = VideoTier(THRESHOLD, 64 * 1024**2)
    assert tier.record(_query(clip), "t")
    return tier


@pytest.mark.parametrize("codec", ["mp4v", "mjpg"])
def test_a_lossy_re_encode_is_verified_frame_by_frame(tier, clip, codec):
    match = tier.lookup(_query(clip, codec), "t")
    assert match is not None and match.canonical_hash == "a-ffv1" and match.url == "data:a"
    assert 0 < match.distance <= THRESHOLD


def test_a_resized_copy_is_verified(tier, clip):
    import cv2

    bigger = np.stack([cv2.resize(f, (192, 192), interpolation=cv2.INTER_AREA) for f in clip])
    assert tier.lookup(_query(bigger, "mp4v"), "t") is not None


def _edited(clip: np.ndarray, edit: str) -> np.ndarray:
    out = clip.copy()
    if edit == "one_frame":
        out[6, 20:70, 20:70] = (255, 255, 0)  # a frame the sampling takes (0, 2, 4, 6, ...)
    elif edit == "object_in_last_frame":
        out[-1, 90:120, 90:120] = (10, 250, 10)
    elif edit == "reversed":
        out = clip[::-1].copy()
    elif edit == "shifted":
        out = np.concatenate([clip[1:], clip[-1:]])
    elif edit == "trimmed":
        out = clip[:-3].copy()
    elif edit == "other_clip":
        out = synthetic_frames(4, n=16)
    return out


@pytest.mark.parametrize("edit", ["one_frame", "object_in_last_frame", "reversed", "shifted",
                                  "trimmed", "other_clip"])
@pytest.mark.parametrize("codec", ["ffv1", "mp4v"])
def test_a_changed_clip_is_never_canonicalized(tier, clip, edit, codec):
    assert tier.lookup(_query(_edited(clip, edit), codec, name=edit), "t") is None


def test_tenants_are_apart_and_lookups_have_no_side_effects(tier, clip):
    query = _query(clip, "mp4v")
    assert tier.lookup(query, "other") is None
    assert len(tier) == 1 and tier.lookup(query, "t") is not None and len(tier) == 1
    canon = canonical_videos(tier, (query,), (query.content_hash,), "t")
    assert canon.changed and canon.hashes == ("a-ffv1",) and canon.urls == ("data:a",)
    assert canonical_videos(tier, (query,), (query.content_hash,), "other").status == "miss"
    assert canonical_videos(None, (query,), (query.content_hash,), "t").status == "skip"


def test_memory_is_bounded_and_one_tenant_holds_at_most_half(clip):
    one = _query(clip)
    tier = VideoTier(THRESHOLD, 4 * one.nbytes + 10)
    for k in range(5):
        tier.record(VideoQuery(f"a{k}", one.signature, one.thumbs, "u"), "flood")
    tier.record(VideoQuery("b", one.signature, one.thumbs, "u"), "quiet")
    flood = [h for (t, h) in tier._entries if t == "flood"]
    assert flood == ["a3", "a4"] and ("quiet", "b") in tier._entries
    assert tier._bytes <= tier.budget_bytes


def _pan(start: int, n: int = 16, step: int = 1) -> np.ndarray:
    """A camera window panning ``step`` px a frame across a still (slow: one source frame
    moves less than the verifier notices)."""
    still = synthetic_frames(5, 1, 256, 320)[0]
    return np.stack([still[64:192, 40 + step * t:200 + step * t] for t in range(start, start + n)])


@pytest.mark.parametrize("codec", ["ffv1", "mp4v"])
@pytest.mark.parametrize("step", [1, 2])
def test_a_slow_pan_started_one_frame_later_is_refused(codec, step):
    # sampled every 2 frames, each shifted frame passed the threshold and lay nearer its
    # own index than the neighbours: the time-offset check is what refuses it
    tier = VideoTier(THRESHOLD, 64 * 1024**2)
    tier.record(_query(_pan(0, step=step)), "t")
    assert tier.lookup(_query(_pan(1, step=step), codec, name="later"), "t") is None
    assert tier.lookup(_query(_pan(0, step=step), "mjpg", name="copy"), "t") is not None


def test_time_offset_measures_the_share_of_a_step():
    clip = _pan(0, n=17).astype(np.float32)
    thumbs = video_thumbnails(clip.astype(np.uint8))
    # every other frame as the candidate; the frames one later as the query
    share, correlation = time_offset(thumbs[1::2][:8], thumbs[0::2][:8])
    assert 0.3 < share < 0.7 and correlation > 0.5
    assert time_offset(thumbs[0::2][:8], thumbs[0::2][:8]) == (0.0, 0.0)


def test_a_still_clip_has_no_time_offset():
    still = np.repeat(synthetic_frames(6, 1, 128, 128), 8, axis=0)
    noisy = np.clip(still + np.random.default_rng(0).normal(0, 4, still.shape), 0, 255)
    share, _ = time_offset(video_thumbnails(noisy.astype(np.uint8)), video_thumbnails(still))
    assert share == 0.0  # nothing moves: no step to be offset along


def test_a_faint_object_in_one_frame_is_refused_though_the_frame_passes():
    # a dark box on the clip's dark corner: the frame alone passes the image threshold,
    # but no re-encode makes one frame stand out from the rest
    clip = synthetic_frames(3, n=16)
    edited = clip.copy()
    patch = edited[6, 4:40, 4:40].astype(np.int16)
    edited[6, 4:40, 4:40] = np.clip(patch + 28, 0, 255).astype(np.uint8)
    canon, query = _query(clip), _query(edited, "ffv1", name="faint")
    frame = aligned_distance(query.thumbs[3].astype(np.float32),
                             canon.thumbs[3].astype(np.float32))
    assert FRAME_EXCESS_MAX < frame <= THRESHOLD
    tier = VideoTier(THRESHOLD, 64 * 1024**2)
    tier.record(canon, "t")
    assert tier.lookup(query, "t") is None


def test_candidates_probed_at_once_agree_with_the_verifier():
    """The lookup probes its candidates together; a refused probe is a refused clip."""
    from vlmcache.tiers.video import probe_passes, verify_frames, video_thumbnails

    rng = np.random.default_rng(1)
    clip = synthetic_frames(3, n=12)
    near = np.clip(clip.astype(np.int16) + rng.integers(-2, 3, clip.shape), 0, 255)
    others = [synthetic_frames(seed, n=12) for seed in (4, 5)]
    thumbs = [video_thumbnails(x.astype(np.uint8)) for x in [near, *others]]
    query = video_thumbnails(clip)
    passed = probe_passes(query, thumbs + [thumbs[0][:6]], 0.19)
    assert passed == [True, False, False, False]
    assert [verify_frames(query, t, 0.19) is not None for t in thumbs] == passed[:3]


def test_a_lazy_clip_is_decided_as_a_whole_one_and_recorded_whole():
    """A lookup on background-made thumbnails decides as on thumbnails made up front, and
    making a clip canonical keeps its thumbnails whole, the frames let go."""
    from vlmcache.tiers.video_thumbs import FrameThumbs

    clip = synthetic_frames(3, n=12)
    near = np.clip(clip.astype(np.int16) + 2, 0, 255).astype(np.uint8)
    sig = VideoSignature(12, tuple(range(12)), 4.0)
    for lazy in (False, True):
        tier = VideoTier(0.19, 1 << 26)
        made = FrameThumbs.from_frames(clip) if lazy else video_thumbnails(clip)
        assert tier.record(VideoQuery("canon", sig, made, "u"), "t")
        other = VideoQuery("other", sig, FrameThumbs.from_frames(synthetic_frames(9, n=12)),
                           "o")
        query = VideoQuery("near", sig, FrameThumbs.from_frames(near), "n")
        assert tier.lookup(other, "t") is None
        assert tier.lookup(query, "t").canonical_hash == "canon"
        stored = tier._entries[("t", "canon")].thumbs
        assert stored._frames is None and np.array_equal(stored.all(), video_thumbnails(clip))


def test_a_far_candidate_is_refused_by_its_coarse_means_without_a_probe(monkeypatch, clip):
    import vlmcache.tiers.video as video

    tier = VideoTier(THRESHOLD, 64 * 1024**2)
    assert tier.record(_query(synthetic_frames(11, n=16), name="other"), "t")
    probed = []
    monkeypatch.setattr(video, "probe_passes",
                        lambda q, cands, t: probed.append(len(cands)) or [False] * len(cands))
    assert tier.lookup(_query(clip), "t") is None
    assert probed == []  # another scene: no frame of it was compared


def test_a_brightened_copy_stays_a_candidate_and_is_verified(tier, clip):
    from vlmcache.tiers.video import COARSE_REFUSE, coarse_distance

    brighter = np.clip(clip.astype(np.float32) * 1.1, 0, 255).astype(np.uint8)
    query = _query(brighter, "mjpg")
    original = _query(clip)
    assert coarse_distance(query.coarse, original.coarse) < COARSE_REFUSE / 2
    assert float(np.abs(query.coarse - original.coarse).mean()) > 2.0  # the gain explains it
    match = tier.lookup(query, "t")
    assert match is not None and match.canonical_hash == "a-ffv1"
