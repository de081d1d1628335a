"""The front loads its embedders before it takes requests (not on the first request)."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import numpy as np

from vlmcache.cascade import Cascade
from vlmcache.config import VlmCacheConfig
from vlmcache.embedders import Memoized, text_digest
from vlmcache.keys import image_content_hash
from vlmcache.serving.front import CascadeFront, warm_up


class CountingEmbedder:
    name, dim = "counting", 4

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[list[object]] = []
        self.fail = fail

    def embed(self, items):
        if self.fail:
            raise OSError("weights missing")
        self.calls.append(list(items))
        return np.ones((len(items), self.dim), np.float32) / 2.0


def _cascade(text: CountingEmbedder | None, image: CountingEmbedder | None) -> Cascade:
    tier = lambda e, d: None if e is None else SimpleNamespace(embedder=Memoized(e, d))  # noqa: E731
    return Cascade(None, tier(image, image_content_hash), tier(text, text_digest))


def test_warm_up_embeds_one_sample_per_embedder_and_memoizes_nothing():
    text, image = CountingEmbedder(), CountingEmbedder()
    cascade = _cascade(text, image)
    warm_up(cascade)
    assert len(text.calls) == 1 and isinstance(text.calls[0][0], str)
    assert len(image.calls) == 1 and image.calls[0][0].size == (64, 64)
    # the warm-up's sample is no cached vector: a real request embeds its own
    assert cascade.text.embedder._memo == {} and cascade.image.embedder._memo == {}


def test_a_failed_warm_up_is_logged_and_the_front_still_builds(caplog):
    caplog.set_level(logging.WARNING, logger="vlmcache.serving.front")
    warm_up(_cascade(CountingEmbedder(fail=True), None))
    assert "warm-up failed (OSError: weights missing)" in caplog.text


def test_warm_up_without_similarity_tiers_does_nothing(caplog):
    caplog.set_level(logging.INFO, logger="vlmcache.serving.front")
    warm_up(_cascade(None, None))
    assert "embedders loaded" not in caplog.text


def test_for_model_warms_the_front_it_builds(tmp_path, monkeypatch):
    (tmp_path / "m").mkdir()
    warmed: list[Cascade] = []
    monkeypatch.setattr("vlmcache.serving.front.warm_up", warmed.append)
    front = CascadeFront.for_model(str(tmp_path / "m"), VlmCacheConfig(
        store_path=str(tmp_path / "s"), model_revision="t"), metrics=None)
    assert warmed == [front.cascade]
