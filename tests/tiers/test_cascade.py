"""Cascade order and hit policy, with fake tiers."""

from __future__ import annotations

from vlmcache.cascade import STATUS_ORDER, Candidates, Cascade, CascadeRequest
from vlmcache.keys import KVRowKeys, kv_row_key
from vlmcache.testing.text_embedder import HashedBagOfWords
from vlmcache.tiers.exact import ExactRecord
from vlmcache.tiers.image_embedding import ImageMatch
from vlmcache.tiers.semantic_text import (
    PROMPT_LAYER,
    QUESTION_LAYER,
    TextLookup,
    TextMatch,
    image_context,
)

PROMPT = "USER: <image>\nWhat color is the car? ASSISTANT:"
NS = "a" * 64


class FakeExact:
    def __init__(self, known):
        self.known, self.calls = dict(known), []

    def lookup(self, prompt, hashes, tenant):
        self.calls.append((prompt, tuple(hashes)))
        text = self.known.get((prompt, tuple(hashes)))
        return None if text is None else ExactRecord("k", text, tuple(hashes), (), 1, 0.0)


class FakeImage:
    threshold = 0.85

    def __init__(self, canon):
        self.canon, self.recorded = dict(canon), []

    def best(self, image, h, tenant):
        c = self.canon.get(h)
        return None if c is None else ImageMatch(c[0], c[1], None)

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

    def best(self, query, layers):
        self.queries.append((query, tuple(layers)))
        return self.match

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


class RecordingExact(FakeExact):
    def __init__(self, known):
        super().__init__(known)
        self.recorded = []

    def record(self, prompt, hashes, tenant, chunk_keys, prompt_tokens):
        self.recorded.append((prompt, tuple(hashes), tuple(chunk_keys)))


def test_a_served_request_is_recorded_unless_a_record_decided_it():
    exact = RecordingExact({(PROMPT, ("a",)): PROMPT})
    cascade = Cascade(exact, FakeImage({"b": ("a", 0.93)}), FakeText())
    hit = cascade.resolve(PROMPT, ("a",), None, images=("A",))
    on_hit = KVRowKeys.pack(NS, [b"k1", b"k2"])
    cascade.record_served(hit, None, on_hit, 70)  # a GPU hit on the record: no rewrite
    assert "store_keys" not in vars(on_hit)  # nor its store keys derived
    near = cascade.resolve(PROMPT, ("b",), None, images=("B",))  # canonical image: recorded
    cascade.record_served(near, None, KVRowKeys.pack(NS, [b"k1"]), 70)
    miss = cascade.resolve(PROMPT, ("c",), None, images=("C",))
    cascade.record_served(miss, None, KVRowKeys(), 70)  # no KV keys (KV cache off)
    cascade.record_served(miss, None, KVRowKeys.pack(NS, [b"k3"]), 70)
    k1, k3 = kv_row_key(NS, b"k1"), kv_row_key(NS, b"k3")
    assert exact.recorded == [(PROMPT, ("a",), (k1,)), (PROMPT, ("c",), (k3,))]
    unused = KVRowKeys.pack(NS, [b"k4"])
    Cascade(None).record_served(miss, None, unused, 70)  # no exact tier: no record to key
    assert "store_keys" not in vars(unused)


def test_no_tiers_configured():
    res = Cascade(None).resolve(PROMPT, (), None)
    assert res.hit_tier is None and res.statuses == {"exact_text": "skip"}


def test_best_candidates_with_fakes_ignore_thresholds():
    match = TextMatch(QUESTION_LAYER, "Is there no car?", "USER: <image>\nIs there no car?", 0.6)
    text = FakeText(match)
    cascade = Cascade(FakeExact({}), FakeImage({"b": ("a", 0.93), "c": ("a", 0.4)}), text)
    near = cascade.best_candidates(PROMPT, ("b",), "t", images=("B",), question="Is there a car?")
    assert near == Candidates(0.93, "a", 0.6, "Is there no car?", match.prompt, True, ("a",))
    assert text.queries[-1][0].context == image_context(("a",))  # canonical: 0.93 >= 0.85
    far = cascade.best_candidates(PROMPT, ("c",), "t", images=("C",), question="Is there no car?")
    assert far.image_score == 0.4 and far.image_canonical == "a" and not far.gate_refused
    assert text.queries[-1][0].context == image_context(("c",))  # below threshold: own images
    none = Cascade(None, FakeImage({}), FakeText()).best_candidates(PROMPT, ("z",), None,
                                                                     images=("Z",))
    assert none == Candidates(None, None, None, None, None, False)


def test_best_candidates_with_real_tiers_have_no_side_effects(tmp_path):
    from vlmcache.embedders import Memoized, text_digest
    from vlmcache.embedders.image import PerceptualHashEmbedder
    from vlmcache.keys import image_content_hash
    from vlmcache.store.memory import MemoryStore
    from vlmcache.store.tiered import TieredStore
    from vlmcache.testing.tiny_llava import make_test_image
    from vlmcache.tiers.image_embedding import ImageEmbeddingTier
    from vlmcache.tiers.semantic_text import SemanticTextTier, TextQuery

    store = TieredStore(MemoryStore(10 * 224 * 224 * 3), None)
    image = ImageEmbeddingTier(tmp_path / "img", "ab" * 32,
                               Memoized(PerceptualHashEmbedder(), image_content_hash), store, 0.99)
    thresholds = {QUESTION_LAYER: 0.99, PROMPT_LAYER: 0.99}
    text = SemanticTextTier(tmp_path / "txt", "ab" * 32, Memoized(HashedBagOfWords(32), text_digest),
                            thresholds)
    a, b = make_test_image(1), make_test_image(2)
    ha, hb = image_content_hash(a), image_content_hash(b)
    image.record(a, ha, None)
    text.record(TextQuery("is there a red circle?", "USER: <image>\nis there a red circle?",
                          image_context((ha,)), None))
    cascade = Cascade(None, image, text)
    own = cascade.best_candidates(PROMPT, (ha,), None, images=(a,),
                                  question="is there a blue circle?")
    assert own.image_score == 1.0 and own.image_canonical == ha
    assert own.text_question == "is there a red circle?" and 0 < own.text_score < 0.99
    assert own.gate_refused and own.text_prompt == "USER: <image>\nis there a red circle?"
    other = cascade.best_candidates(PROMPT, (hb,), None, images=(b,), question="is there a circle?")
    assert other.image_canonical is None  # another picture: the verifier refuses it
    assert other.text_score is None  # b is not canonicalized: its own context has no entry
    assert cascade.best_candidates(PROMPT, (hb,), "acme", images=(b,)).image_score is None
    assert len(image.index) == 1 and len(text.indexes[QUESTION_LAYER]) == 1
    assert text.thresholds == thresholds and text.gate and image.threshold == 0.99


def test_canonical_images_are_charged_to_their_tenant_on_disk(tmp_path):
    from vlmcache.cascade import build_cascade
    from vlmcache.config import VlmCacheConfig
    from vlmcache.keys import image_content_hash
    from vlmcache.testing.tiny_llava import make_test_image

    config = VlmCacheConfig(store_path=str(tmp_path), enable_image_embedding=True,
                            enable_exact=False, tenant_quota=0.5)
    cascade = build_cascade(config, "ab" * 32)
    tier = cascade.image
    image = make_test_image(3)
    assert tier.record(image, image_content_hash(image), "acme")
    disk = tier.store.disk
    assert [(o.tenant, o.entries) for o in disk.tenant_occupancy()] == [("acme", 1)]
    assert disk._tenants.quota == config.image_store_budget // 2 and disk.protect_reused


def test_videos_bind_the_exact_and_paraphrase_tiers_and_are_recorded_with_them():
    video_prompt = "<|m:user|>\n<video>\n<|p|>\nWhat moves?"
    exact = FakeExact({(video_prompt, ("v1",)): video_prompt})
    text = FakeText()
    cascade = Cascade(exact, None, text)
    hit = cascade.resolve(video_prompt, (), "t", video_hashes=("v1",))
    assert hit.hit_tier == "text:exact" and hit.video_hashes == ("v1",)
    miss = cascade.resolve(video_prompt, (), "t", video_hashes=("v2",))
    assert miss.hit_tier is None and exact.calls[-1] == (video_prompt, ("v2",))
    # the paraphrase tier is asked about this video's context, not an image-less one
    assert text.queries[-1][0].context == image_context(("v2",)) != image_context(())
    cascade.remember(CascadeRequest(video_prompt, (), "t", (), None, ("v2",)), miss)
    assert text.recorded[-1].context == image_context(("v2",))
