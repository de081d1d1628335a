"""Cascade order and hit policy, with fake tiers."""

from __future__ import annotations

from vlmcache.cascade import STATUS_ORDER, Cascade, CascadeRequest
from vlmcache.tiers.exact import ExactRecord
from vlmcache.tiers.image_embedding import ImageMatch
from vlmcache.tiers.semantic_text import (
    PROMPT_LAYER,
    QUESTION_LAYER,
    TextLookup,
    TextMatch,
)

PROMPT = "USER: <image>\nWhat color is the car? ASSISTANT:"


class FakeExact:
    def __init__(self, known):
        self.known, self.calls = dict(known), []

    def lookup(self, prompt, hashes, tenant):
        self.calls.append((prompt, tuple(hashes)))
        text = self.known.get((prompt, tuple(hashes)))
        return None if text is None else ExactRecord("k", text, tuple(hashes), (), 1, 0.0)


class FakeImage:
    def __init__(self, canon):
        self.canon, self.recorded = dict(canon), []

    def lookup(self, image, h, tenant):
        c = self.canon.get(h)
        return None if c is None else ImageMatch(c[0], c[1], f"pixels-of-{c[0]}")

    def record(self, image, h, tenant):
        self.recorded.append(h)


class FakeText:
    def __init__(self, match=None):
        self.match, self.queries, self.recorded = match, [], []

    def lookup(self, query, layers):
        self.queries.append((query, tuple(layers)))
        return TextLookup(self.match, {})

    def record(self, query):
        self.recorded.append(query)


def test_exact_hit_decides_first():
    exact = FakeExact({(PROMPT, ("a",)): PROMPT})
    text = FakeText(TextMatch(QUESTION_LAYER, "q", "p", 0.99))
    res = Cascade(exact, FakeImage({}), text).resolve(PROMPT, ("a",), None, images=("A",))
    assert res.hit_tier == "text:exact" and res.similarity == 1.0
    assert text.queries == []
    assert list(res.statuses) == list(STATUS_ORDER[:4])


def test_near_duplicate_image_reuses_canonical_prompt():
    exact = FakeExact({(PROMPT, ("a",)): PROMPT})
    res = Cascade(exact, FakeImage({"b": ("a", 0.93)}), FakeText()).resolve(
        PROMPT, ("b",), None, images=("B",))
    assert res.hit_tier == "embedding:vision" and res.similarity == 0.93
    assert res.image_hashes == ("a",) and res.images == ("pixels-of-a",)
    assert res.statuses["embedding:vision"] == "hit" and res.statuses["exact_text"] == "miss"
    assert res.rewrite.canonical_images == ("a",) and res.rewrite.image_scores == (0.93,)


def test_paraphrase_rewrites_only_the_question():
    match = TextMatch(QUESTION_LAYER, "Which colour is the vehicle?",
                      "SYSTEM: x USER: <image>\nWhich colour is the vehicle? ASSISTANT:", 0.9)
    text = FakeText(match)
    res = Cascade(FakeExact({}), FakeImage({"a": ("a", 1.0)}), text).resolve(
        PROMPT, ("a",), "t", images=("A",), question="What color is the car?")
    assert res.prompt == "USER: <image>\nWhich colour is the vehicle? ASSISTANT:"
    assert res.hit_tier == QUESTION_LAYER and res.similarity == 0.9
    assert res.statuses == {"exact_text": "miss", "embedding:vision": "miss",
                            PROMPT_LAYER: "miss", QUESTION_LAYER: "hit"}
    assert res.images is None and res.matched.canonical_prompt == res.prompt
    query, layers = text.queries[0]
    assert query.question == "What color is the car?" and query.tenant == "t"
    assert layers == (PROMPT_LAYER, QUESTION_LAYER)


def test_prompt_layer_rewrites_the_whole_prompt():
    match = TextMatch(PROMPT_LAYER, "q", "USER: <image>\nWhat colour is the car? ASSISTANT:", 0.95)
    res = Cascade(None, None, FakeText(match)).resolve(PROMPT, ("a",), None, images=("A",))
    assert res.prompt == match.prompt and res.hit_tier == PROMPT_LAYER
    assert res.statuses == {"exact_text": "skip", PROMPT_LAYER: "hit", QUESTION_LAYER: "miss"}


def test_image_only_hit_keeps_question_and_miss_is_remembered():
    image, text = FakeImage({"b": ("a", 0.9)}), FakeText()
    cascade = Cascade(FakeExact({}), image, text)
    res = cascade.resolve(PROMPT, ("b",), None, images=("B",))
    assert res.hit_tier == "embedding:vision" and res.prompt == PROMPT
    miss = cascade.resolve(PROMPT, ("c",), None, images=("C",))
    assert miss.hit_tier is None and miss.statuses["embedding:vision"] == "miss"
    cascade.remember(CascadeRequest(PROMPT, ("c",), None, ("C",)), miss)
    cascade.remember(CascadeRequest(PROMPT, ("a",), None, ("B",)), res)
    assert image.recorded == ["c"]
    # both served their own question (no question given: the prompt without placeholders)
    assert [q.question for q in text.recorded] == ["USER: What color is the car? ASSISTANT:"] * 2
    assert text.recorded[1].context != text.recorded[0].context  # about a, about c


def test_no_tiers_configured():
    res = Cascade(None).resolve(PROMPT, (), None)
    assert res.hit_tier is None and res.statuses == {"exact_text": "skip"}
