"""Semantic text tiers with the real MiniLM: paraphrase hits, gates, context, restart."""

from __future__ import annotations

import pytest

from vlmcache.embedders import Memoized, make_text_embedder, text_digest
from vlmcache.tiers.semantic_text import (
    PROMPT_LAYER,
    QUESTION_LAYER,
    SemanticTextTier,
    TextQuery,
    image_context,
    strip_placeholders,
)

NS = "cd" * 32
CTX = image_context(["img-a"])
LAYERS = (PROMPT_LAYER, QUESTION_LAYER)


@pytest.fixture(scope="module")
def embedder():
    return Memoized(make_text_embedder("minilm"), text_digest)


def _tier(root, embedder, threshold=0.85, gate=True):
    return SemanticTextTier(root, NS, embedder, {QUESTION_LAYER: threshold,
                                                 PROMPT_LAYER: threshold}, gate)


def _q(question, context=CTX, tenant=None):
    return TextQuery(question, f"USER: <image>\n{question} ASSISTANT:", context, tenant)


def test_strip_placeholders():
    assert strip_placeholders("USER: <image>\nWhat? <|image_pad|> ASSISTANT:") == \
        "USER: What? ASSISTANT:"


def test_paraphrase_hits_and_unrelated_misses(tmp_path, embedder):
    tier = _tier(tmp_path, embedder)
    tier.record(_q("What color is the car?"))
    found = tier.lookup(_q("Which colour is the vehicle?"), LAYERS)
    assert found.match is not None and found.match.question == "What color is the car?"
    assert found.match.prompt == "USER: <image>\nWhat color is the car? ASSISTANT:"
    assert found.match.score >= 0.85
    assert tier.lookup(_q("What is the weather today?"), LAYERS).match is None


def test_other_image_or_tenant_misses(tmp_path, embedder):
    tier = _tier(tmp_path, embedder)
    tier.record(_q("What color is the car?"))
    assert tier.lookup(_q("What color is the car?", image_context(["b"])), LAYERS).match is None
    assert tier.lookup(_q("What color is the car?", tenant="acme"), LAYERS).match is None


def test_gate_refuses_negation_and_colour(tmp_path, embedder):
    tier = _tier(tmp_path, embedder)
    tier.record(_q("Is there a red circle?"))
    negated = tier.lookup(_q("Is there not a red circle?"), LAYERS)
    assert negated.match is None and negated.scores[QUESTION_LAYER] >= 0.85
    assert any("negated" in r for r in negated.refused)
    assert tier.lookup(_q("Is there a blue circle?"), LAYERS).match is None
    ungated = _tier(tmp_path / "ungated", embedder, gate=False)
    ungated.record(_q("Is there a red circle?"))
    assert ungated.lookup(_q("Is there not a red circle?"), LAYERS).match is not None


def test_threshold_respected(tmp_path, embedder):
    tier = _tier(tmp_path, embedder, threshold=0.99)
    tier.record(_q("What color is the car?"))
    found = tier.lookup(_q("Which colour is the vehicle?"), LAYERS)
    assert found.match is None and 0.85 < found.scores[QUESTION_LAYER] < 0.99


def test_indexes_survive_restart(tmp_path, embedder):
    tier = _tier(tmp_path, embedder)
    tier.record(_q("What color is the car?"))
    tier.flush()
    found = _tier(tmp_path, embedder).lookup(_q("Which colour is the vehicle?"), LAYERS)
    assert found.match is not None


def test_second_stage_accepts_lower_cosine_only_when_facets_and_content_agree(tmp_path,
                                                                               embedder):
    tier = SemanticTextTier(tmp_path, NS, embedder, {QUESTION_LAYER: 0.85, PROMPT_LAYER: 0.85},
                            True, facet_threshold=0.65)
    tier.record(_q("is there a circle?"))
    tier.record(_q("is the door open?"))
    para = tier.lookup(_q("Is some circle visible here?"), (QUESTION_LAYER,))
    assert para.match is not None and para.match.question == "is there a circle?"
    assert para.match.score < 0.85  # only the second stage admits it
    assert tier.lookup(_q("is the door closed?"), (QUESTION_LAYER,)).match is None
    assert tier.lookup(_q("Is some triangle visible here?"), (QUESTION_LAYER,)).match is None
    strict = SemanticTextTier(tmp_path / "strict", NS, embedder,
                              {QUESTION_LAYER: 0.85, PROMPT_LAYER: 0.85}, True)
    strict.record(_q("is there a circle?"))
    assert strict.lookup(_q("Is some circle visible here?"), (QUESTION_LAYER,)).match is None


def test_scopes_are_searched_alone(tmp_path, embedder):
    tier = _tier(tmp_path, embedder)
    tier.record(_q("What color is the car?", context=image_context(["img-b"])))
    tier.record(_q("What color is the car?", tenant="acme"))
    assert tier.lookup(_q("What color is the car?"), LAYERS).match is None
    assert tier.lookup(_q("What color is the car?", tenant="acme"), LAYERS).match is not None


def test_a_scope_with_nothing_recorded_is_not_embedded(tmp_path, embedder):
    """A new image's first question cannot match: no embedding is paid for it."""
    class Counting:
        dim = embedder.dim

        def __init__(self):
            self.texts = 0

        def embed(self, texts, keys=None):
            self.texts += len(texts)
            return embedder.embed(texts)

    counting = Counting()
    tier = SemanticTextTier(tmp_path, NS, counting, {QUESTION_LAYER: 0.85,
                                                     PROMPT_LAYER: 0.85}, True)
    assert tier.lookup(_q("What color is the car?"), LAYERS).match is None
    assert counting.texts == 0
    tier.record(_q("What color is the car?"))
    recorded = counting.texts
    other = _q("Which colour is the vehicle?", context=image_context(["img-b"]))
    assert tier.lookup(other, LAYERS).match is None and counting.texts == recorded
    assert tier.lookup(_q("Which colour is the vehicle?"), LAYERS).match is not None
    assert counting.texts == recorded + 2  # both layers, where something is recorded


def test_an_unsearched_scope_s_texts_are_embedded_in_the_background_for_the_record(
        tmp_path, embedder):
    import time

    class Counting:
        name, dim = "counting", embedder.dim

        def __init__(self):
            self.texts = []

        def embed(self, texts):
            self.texts += list(texts)
            return embedder.embed(texts)

    counting = Counting()
    tier = SemanticTextTier(tmp_path, NS, Memoized(counting, text_digest),
                            {QUESTION_LAYER: 0.85, PROMPT_LAYER: 0.85}, True)
    query = _q("How many wheels does it have?")
    assert tier.lookup(query, LAYERS).match is None
    deadline = time.monotonic() + 30
    while len(counting.texts) < 2:  # both layers' texts, off the lookup's path
        assert time.monotonic() < deadline
        time.sleep(0.01)
    tier.record(query)  # the prefetched vectors: nothing embedded again
    assert sorted(counting.texts) == sorted([query.question, strip_placeholders(query.prompt)])
