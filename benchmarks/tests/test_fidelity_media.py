"""Fidelity pieces that need no engine: photographs, their colour edits, clips and their
variants through the front's video path, and the video/photo targets."""

from __future__ import annotations

import numpy as np
import pytest

from vlmcache_lab.fidelity_clips import (FRAMES, NUM_FRAMES, SIZE, encode, photo_clip,
                                         synthetic_clip, variants)
from vlmcache_lab.fidelity_data import Probe, ShapeAttrs
from vlmcache_lab.fidelity_photos import (PHOTO, PHOTO_HARD, TEST_PHOTOS, TRAIN_PHOTOS,
                                          load_photo, views)
from vlmcache_lab.fidelity_summary import (Row, outcome, row_json, rows_from_json, summarize,
                                           targets)
from vlmcache_lab.fidelity_video import _decode, run_videos


def test_photographs_ship_with_packages_and_splits_are_apart():
    assert not set(TRAIN_PHOTOS) & set(TEST_PHOTOS)
    for name in TRAIN_PHOTOS + TEST_PHOTOS:
        photo = load_photo(name)
        assert photo.mode == "RGB" and min(photo.size) >= 256
        # a colour photograph: some of its pixels are coloured (a deep field: its galaxies)
        arr = np.asarray(photo.resize((64, 64)), np.float32)
        assert np.quantile(np.abs(arr - arr.mean(axis=2, keepdims=True)).max(axis=2),
                           0.99) > 15


@pytest.mark.parametrize("kind", sorted(PHOTO_HARD))
def test_photo_colour_edits_change_colour_not_layout(kind):
    rng = np.random.default_rng(0)
    view = views(load_photo("chelsea"), 1, rng)[0]
    edited = PHOTO_HARD[kind](view, PHOTO, rng, "q")
    assert edited is not None and edited.image.size == view.size
    a, b = (np.asarray(im, np.float32) for im in (view, edited.image))
    chroma = lambda x: x - x.mean(axis=2, keepdims=True)  # noqa: E731
    assert np.abs(chroma(a) - chroma(b)).mean() > 4  # the colours moved


def test_clip_renderers_continue_and_restart():
    clip = photo_clip("chelsea", load_photo("chelsea"), 0, 0)
    frames = clip.frames()
    assert frames.shape == (FRAMES, SIZE[1], SIZE[0], 3)
    assert np.array_equal(clip.render(1, FRAMES)[:-1], frames[1:])
    assert not np.array_equal(clip.same_scene(0, FRAMES), frames)
    syn = synthetic_clip(3)
    assert np.array_equal(syn.render(2, 4), syn.frames()[2:6])


def test_variants_decode_through_the_front_path():
    clip = synthetic_clip(1)
    seed = encode(clip.frames())
    decoded, _ = _decode(seed)
    assert decoded.frames == NUM_FRAMES
    out = variants(clip, seed, decoded.signature.frame_indices, np.random.default_rng(0))
    remux, _ = _decode(out["video:benign_remux"])
    assert remux.content_hash == decoded.content_hash  # same frames, another container
    sizes = [len(out[f"video:benign_reencode_q{q}"]) for q in (90, 30)]
    assert sizes[0] > sizes[1]  # two qualities, two bitrates
    trimmed, _ = _decode(out["video:hard_trimmed"])
    assert trimmed.signature.frame_indices != decoded.signature.frame_indices


def test_a_small_video_run_hits_benign_and_refuses_hard():
    rows = run_videos([synthetic_clip(2)], threshold=0.18)
    kinds = {r.probe.category: outcome(r) for r in rows if r.probe.category != "seed"}
    assert kinds["video:benign_remux"] == "right"
    assert all(v == "miss" for k, v in kinds.items() if k.startswith("video:hard"))
    assert sum(v == "right" for k, v in kinds.items() if "benign" in k) >= 4


def test_video_and_photo_targets():
    a = ShapeAttrs("video", "?")
    rows = [Row(Probe("video:benign_remux", None, "", a, "c:video:benign_remux", True,
                      source="c"), hit_tier="exact", canonical_image="c"),
            Row(Probe("video:hard_reversed", None, "", a, "c:video:hard_reversed", False,
                      source="c"), hit_tier="video", canonical_image="c"),
            Row(Probe("photo:benign_jpeg_q35", None, "q", PHOTO, "p:photo:benign_jpeg_q35",
                      True, source="p"), canonical_image="p:photo:benign_noise_s6")]
    rows.append(Row(Probe("seed", None, "", a, "c", False, source="c")))
    rows.append(Row(Probe("seed", None, "what color is the shape?", PHOTO, "p", False,
                          source="p")))
    as_json = [row_json(r) for r in rows]  # seeds of clips and photographs: no truth
    assert [r["gt"] for r in as_json] == [None] * 5
    variants = summarize(rows)
    assert summarize(rows_from_json(as_json)) == variants
    assert variants["video:benign_remux"]["accuracy"] is None
    t = targets(variants)
    assert t["video_hard_negative_hits"] == {"video:hard_reversed": 1}
    assert not t["video_hard_negatives_zero"] and t["video_benign_all_at_least_95pct"]
    assert t["photo_benign_right_rate"] == {"photo:benign_jpeg_q35": 1.0}
