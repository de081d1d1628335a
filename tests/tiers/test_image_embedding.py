"""Image embedding tier: canonical images, tenant isolation, eviction, restart."""

from __future__ import annotations

import io

import numpy as np
from PIL import Image, ImageChops

from vlmcache.embedders import Memoized
from vlmcache.embedders.image import PerceptualHashEmbedder
from vlmcache.keys import image_content_hash
from vlmcache.store.disk import DiskStore
from vlmcache.store.memory import MemoryStore
from vlmcache.store.tiered import TieredStore
from vlmcache.testing.tiny_llava import make_test_image
from vlmcache.tiers import calibration
from vlmcache.tiers.image_embedding import (
    ImageEmbeddingTier,
    image_to_tensors,
    tensors_to_image,
)

NS = "ab" * 32
PIXELS = 224 * 224 * 3


def _tier(root, budget=10 * PIXELS, threshold=0.85):
    store = TieredStore(MemoryStore(budget), DiskStore(root / "images", budget))
    return ImageEmbeddingTier(root / "index" / "img", NS,
                              Memoized(PerceptualHashEmbedder(), image_content_hash),
                              store, threshold)


def _recode(image):
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=90)
    return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")


def _h(image):
    return image_content_hash(image)


def test_pixels_round_trip():
    for image in (make_test_image(0), make_test_image(0).convert("L"),
                  make_test_image(0).convert("RGBA")):
        back = tensors_to_image(image_to_tensors(image))
        assert back.mode == image.mode and _h(back) == _h(image)


def test_near_duplicate_maps_to_canonical_pixels(tmp_path):
    tier = _tier(tmp_path)
    a = make_test_image(3)
    assert tier.lookup(a, _h(a), None) is None
    assert tier.record(a, _h(a), None)
    own = tier.lookup(a, _h(a), None)
    assert own.canonical_hash == _h(a) and own.score == 1.0
    b = _recode(a)
    match = tier.lookup(b, _h(b), None)
    assert match.canonical_hash == _h(a) and 0.85 <= match.score <= 1.0
    assert _h(match.image) == _h(a)  # the canonical pixels, not b's
    other = make_test_image(4)
    assert tier.lookup(other, _h(other), None) is None


def test_tenants_and_threshold(tmp_path):
    a = make_test_image(5)
    b = ImageChops.offset(a, 3, 2)  # phash similarity below 1, above 0.5
    strict, loose = _tier(tmp_path / "strict", threshold=0.99), _tier(tmp_path / "loose", threshold=0.5)
    for tier in (strict, loose):
        tier.record(a, _h(a), "acme")
        assert tier.lookup(a, _h(a), "globex") is None
    assert strict.lookup(b, _h(b), "acme") is None
    match = loose.lookup(b, _h(b), "acme")
    assert match is not None and 0.5 <= match.score < 0.99


def test_evicted_canonical_image_leaves_the_index(tmp_path):
    tier = _tier(tmp_path, budget=2 * PIXELS)
    images = [make_test_image(s) for s in (10, 11, 12)]
    for im in images:
        tier.record(im, _h(im), None)
    assert len(tier.index) == 2
    assert tier.lookup(_recode(images[0]), _h(_recode(images[0])), None) is None
    assert tier.lookup(images[2], _h(images[2]), None).score == 1.0


def test_index_survives_restart(tmp_path):
    tier = _tier(tmp_path)
    a = make_test_image(7)
    tier.record(a, _h(a), None)
    tier.flush()
    again = _tier(tmp_path)
    b = _recode(a)
    match = again.lookup(b, _h(b), None)
    assert match is not None and match.canonical_hash == _h(a)
    assert np.array_equal(np.asarray(match.image), np.asarray(a))


#: the shipped calibration's verifier threshold at max_false_hit_rate 0.01
VERIFY = calibration.threshold("image_verify", None, 0.01)


def _colour_tier(root, verify_threshold=VERIFY):
    from vlmcache.embedders.image import ColourLayoutEmbedder

    store = TieredStore(MemoryStore(10 * PIXELS), None)
    return ImageEmbeddingTier(root / "index" / "cl", NS,
                              Memoized(ColourLayoutEmbedder(), image_content_hash), store,
                              0.8, verify_threshold=verify_threshold)


def test_verifier_refuses_recoloured_and_mirrored_candidates(tmp_path):
    import easy_vqa

    from vlmcache_lab.fidelity_data import image_attrs
    from vlmcache_lab.fidelity_variants import shape_mask

    attrs = image_attrs(*easy_vqa.get_test_questions())
    paths = easy_vqa.get_test_image_paths()
    for i in sorted(attrs):  # a coloured shape well off the middle
        image = Image.open(paths[i]).convert("RGB")
        xs = np.nonzero(shape_mask(np.asarray(image, np.float32)))[1]
        if attrs[i].color not in ("black", "gray") and abs(xs.mean() - 31.5) > 12:
            break
    tier = _colour_tier(tmp_path)
    tier.record(image, _h(image), None)
    arr = np.asarray(image)
    shifted = Image.fromarray(np.pad(arr, ((2, 0), (0, 0), (0, 0)), mode="edge")[:64])
    match = tier.lookup(shifted, _h(shifted), None)
    assert match is not None and match.canonical_hash == _h(image) and match.distance < VERIFY
    recoloured = Image.fromarray(arr[:, :, (2, 0, 1)].copy())
    mirrored = Image.fromarray(arr[:, ::-1].copy())
    for probe in (recoloured, mirrored):
        assert tier.lookup(probe, _h(probe), None) is None
        assert tier.best(probe, _h(probe), None) is None  # best() verifies too
    found = tier.verified_candidates(recoloured, _h(recoloured), None)
    assert found and found[0][2] > VERIFY  # a candidate, refused by the verifier


def _frame(x):
    """A video frame: a 14 px blue disc at column ``x`` on a lilac background."""
    from PIL import ImageDraw

    image = Image.new("RGB", (64, 64), (230, 210, 240))
    ImageDraw.Draw(image).ellipse([x, 20, x + 14, 34], fill=(40, 60, 220))
    return image


def test_shifted_search_views_find_a_frame_that_moved(tmp_path):
    """6 px of motion put the frame under the cosine floor (0.78 < 0.8); the search views
    shifted by 5 px find it, and the verifier, which registers up to 8 px, accepts it."""
    first, later = _frame(12), _frame(18)
    tier = _colour_tier(tmp_path / "views")
    tier.record(first, _h(first), None)
    match = tier.lookup(later, _h(later), None)
    assert match is not None and match.canonical_hash == _h(first)
    assert match.score > 0.95  # the best view's cosine
    plain = _colour_tier(tmp_path / "plain")
    plain.shift = 0
    plain.record(first, _h(first), None)
    assert plain.lookup(later, _h(later), None) is None
