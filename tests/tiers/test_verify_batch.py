"""The stacked verifier distance equals the per-pair reference on every kind of pair."""

import numpy as np

from vlmcache.testing.clips import synthetic_frames
from vlmcache.tiers.verify import aligned_distance
from vlmcache.tiers.verify_batch import aligned_distances
from vlmcache.tiers.video import frame_distances, video_thumbnails


def _pairs() -> tuple[np.ndarray, np.ndarray]:
    """Frames against copies with noise, an added object, swapped channels, a flat frame,
    a brightness change, a desaturation and a greyscale frame."""
    rng = np.random.default_rng(0)
    frames = synthetic_frames(1000, n=24, h=96, w=128)
    edited = np.clip(frames.astype(int) + rng.integers(-6, 7, frames.shape), 0, 255)
    edited[3, 20:50, 30:60] = (250, 250, 20)
    edited[5] = edited[5][..., ::-1]
    edited[7] = 3
    edited[9] = np.clip(edited[9] * 1.2 + 10, 0, 255)
    grey = edited[11].mean(axis=2, keepdims=True)
    edited[11] = (0.4 * edited[11] + 0.6 * grey).astype(int)
    edited[13] = grey.astype(int)
    return video_thumbnails(edited.astype(np.uint8)), video_thumbnails(frames)


def test_stacked_distances_equal_the_per_pair_reference():
    query, cand = (t.astype(np.float32) for t in _pairs())
    reference = np.array([aligned_distance(q, c) for q, c in zip(query, cand)])
    assert np.allclose(aligned_distances(query, cand), reference, atol=1e-5)
    assert reference[[3, 5, 13]].min() > 0.3 and reference[[0, 1, 2]].max() < 0.05


def test_threaded_chunks_give_the_same_distances():
    query, cand = (t.astype(np.float32) for t in _pairs())
    assert np.array_equal(frame_distances(query, cand), aligned_distances(query, cand))


def test_stacked_thumbnails_equal_the_per_frame_thumbnail():
    from PIL import Image

    from vlmcache.tiers.verify import thumbnail

    frames = synthetic_frames(7, n=5, h=90, w=130)
    one_by_one = np.stack([np.clip(thumbnail(Image.fromarray(f)), 0, 255).round()
                           .astype(np.uint8) for f in frames])
    assert np.array_equal(video_thumbnails(frames), one_by_one)


def test_stacked_shade_equals_the_per_pair_reference():
    # small objects on a plain background (the shade term reads them), against copies
    # with another shade, another background, noise, and a frame-filling object
    from PIL import Image, ImageDraw

    from vlmcache.tiers.verify import _shading, thumbnail

    def drawn(background, colour, box):
        image = Image.new("RGB", (64, 64), background)
        ImageDraw.Draw(image).polygon([(box[0], box[3]), ((box[0] + box[2]) // 2, box[1]),
                                       (box[2], box[3])], fill=colour)
        return thumbnail(image)

    query = np.stack([drawn((252, 252, 252), (98, 98, 98), (32, 49, 45, 61)),
                      drawn((250, 250, 240), (200, 30, 30), (10, 10, 30, 30)),
                      drawn((250, 250, 250), (40, 40, 40), (2, 2, 62, 62))])
    cand = np.stack([drawn((230, 230, 230), (42, 42, 42), (32, 49, 45, 61)),
                     drawn((250, 250, 240), (200, 30, 30), (10, 10, 30, 30))
                     + np.random.default_rng(1).normal(0, 3, (3, 64, 64)).astype(np.float32),
                     drawn((250, 250, 250), (90, 90, 90), (2, 2, 62, 62))])
    reference = np.array([aligned_distance(q, c) for q, c in zip(query, cand)])
    assert np.allclose(aligned_distances(query, cand), reference, atol=1e-5)
    assert _shading(query[0], cand[0]) > 0 and _shading(query[2], cand[2]) == 0.0


def test_any_exceeds_decides_as_the_largest_distance_does():
    from vlmcache.tiers.verify_batch import any_exceeds

    query, cand = _pairs()
    other = video_thumbnails(synthetic_frames(2000, n=24, h=96, w=128))
    distances = aligned_distances(query, cand)
    stacks = [(query[k:k + 3], cand[k:k + 3]) for k in range(0, 24, 3)]
    stacks += [(query[k:k + 3], other[k:k + 3]) for k in range(0, 24, 6)]
    decided = 0
    for q, c in stacks:
        worst = float(aligned_distances(q, c).max())
        for threshold in (0.02, 0.1, 0.19, 0.5, float(distances.max())):
            assert any_exceeds(q, c, threshold) == (worst > threshold), (worst, threshold)
            decided += worst > threshold
    assert decided > 0 and decided < len(stacks) * 5  # both answers were given
