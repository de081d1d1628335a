"""Similarity tiers end to end on real vLLM: paraphrases (L1), near-duplicate images (L2).

These front-ends share the session's engine (``cached_llm``): the tiers live in
``CachedLLM``, in front of vLLM, so a new front-end on the same store is a restart of
everything they keep. Seeds 20+ are not used by the other e2e tests.
"""

from __future__ import annotations

import pytest
from PIL import ImageChops

from vlmcache.keys import image_content_hash
from vlmcache.testing.engine_job import BLOCK_SIZE, QUESTION, TEST_MEMORY_BUDGET, greedy
from vlmcache.testing.tiny_llava import TINY_LLAVA_PROMPT, make_test_image

pytestmark = pytest.mark.vllm

PARAPHRASE = ("Describe in detail each coloured shape you can see in this picture and say "
              "where each of them is placed.")
RED = "Is there a red circle anywhere in this picture, near any of the other shapes?"


def _req(image, question, tenant=None):
    from vlmcache.api import VlmRequest

    return VlmRequest(TINY_LLAVA_PROMPT.format(question=question), (image,), tenant, question)


def _frontend(cached_llm, tiny_model, store, **overrides):
    from vlmcache.api import CachedLLM
    from vlmcache.config import VlmCacheConfig

    # EfficientNet: these tests rely on a shifted copy matching, which pHash does not catch
    overrides.setdefault("image_embedder", "efficientnet-lite0")
    # the shifts below wrap content around the frame (ImageChops.offset), which the image
    # verifier counts as a change (distance ~0.23); its calibrated default (~0.17) is for
    # easy-vqa, where nothing wraps
    overrides.setdefault("image_verify_threshold", 0.3)
    config = VlmCacheConfig(store_path=str(store), block_size=BLOCK_SIZE, disk_write="sync",
                            memory_budget=TEST_MEMORY_BUDGET,
                            enable_image_embedding=True, enable_semantic_text=True, **overrides)
    return CachedLLM(str(tiny_model), config, engine=cached_llm.llm)


@pytest.fixture(scope="module")
def sem(cached_llm, tiny_model, store_dir):
    return _frontend(cached_llm, tiny_model, store_dir)


def _ask(llm, req):
    return llm.generate([req], greedy())[0]


def _reused(report):
    return report.tokens_loaded + report.tokens_from_prefix_cache


def test_paraphrase_hits_l1_and_answers_as_the_cached_question(sem):
    image = make_test_image(20)
    first = _ask(sem, _req(image, QUESTION))
    assert first.report.hit_tier is None
    assert first.report.statuses["semantic_text"] == "miss"
    assert first.report.statuses["embedding:vision"] == "miss"
    out = _ask(sem, _req(image, PARAPHRASE))
    assert out.report.hit_tier == "semantic_text", out.report.log_line()
    assert out.report.canonical_prompt == TINY_LLAVA_PROMPT.format(question=QUESTION)
    assert out.rewrite.canonical_question == QUESTION and out.rewrite.question_score >= 0.85
    assert out.report.similarity == out.rewrite.question_score
    assert out.report.canonical_question == QUESTION and out.report.canonical_images == ()
    assert f"score={out.report.similarity:.3f}" in out.report.log_line()
    assert out.token_ids == first.token_ids
    assert _reused(out.report) >= 0.9 * out.report.prompt_tokens
    assert "semantic_text=hit" in out.report.log_line()


def test_near_duplicate_image_hits_l2_and_reuses_canonical_caches(sem):
    image = make_test_image(21)
    first = _ask(sem, _req(image, QUESTION))
    assert first.report.statuses["embedding:vision"] == "miss"
    shifted = ImageChops.offset(image, 4, 3)
    out = _ask(sem, _req(shifted, QUESTION))
    assert out.report.hit_tier == "embedding:vision", out.report.log_line()
    assert out.rewrite.canonical_images == (image_content_hash(image),)
    assert 0.85 <= out.rewrite.image_scores[0] < 1.0
    assert out.report.canonical_images == (image_content_hash(image),)
    assert out.report.image_similarity == out.rewrite.image_scores
    assert out.token_ids == first.token_ids
    assert _reused(out.report) >= 0.9 * out.report.prompt_tokens
    # the same shifted picture, tiers off: computed from scratch on its own pixels
    off = sem.generate([_req(shifted, QUESTION)], greedy(), bypass=True)[0]
    assert off.report.tokens_loaded == 0


def test_unrelated_image_or_question_misses(sem):
    out = _ask(sem, _req(make_test_image(22), QUESTION))
    assert out.report.hit_tier is None and out.rewrite is None
    assert out.report.statuses["embedding:vision"] == "miss"
    other_q = _ask(sem, _req(make_test_image(21), "What is the weather like in Paris today?"))
    assert other_q.report.hit_tier is None
    assert other_q.report.statuses["semantic_text"] == "miss"


def test_other_tenant_never_reuses_canonical_image_or_question(sem):
    para = _ask(sem, _req(make_test_image(20), PARAPHRASE, tenant="acme"))
    assert para.report.hit_tier is None and para.report.statuses["semantic_text"] == "miss"
    near = _ask(sem, _req(ImageChops.offset(make_test_image(21), 4, 3), QUESTION, "acme"))
    assert near.report.hit_tier is None
    assert near.report.statuses["embedding:vision"] == "miss"


def test_negated_or_recoloured_question_does_not_hit(sem, cached_llm, tiny_model, store_dir):
    image = make_test_image(23)
    _ask(sem, _req(image, RED))
    negated = _ask(sem, _req(image, RED.replace("Is there a", "Is there not a")))
    assert negated.report.hit_tier is None, negated.report.log_line()
    assert negated.report.statuses["semantic_text"] == "miss"
    assert any("negated" in r for r in negated.rewrite.refused)  # scored >= 0.85: gated
    sem._cascade.flush()
    # MiniLM scores red vs blue ~0.8: at a 0.7 threshold only the gate stops the hit
    loose = _frontend(cached_llm, tiny_model, store_dir, semantic_text_threshold=0.7,
                      prompt_threshold=0.7)
    blue = _ask(loose, _req(image, RED.replace("red", "blue")))
    assert blue.report.hit_tier is None, blue.report.log_line()
    assert any("colours" in r for r in blue.rewrite.refused)


def test_indexes_survive_restart_and_thresholds_are_respected(sem, cached_llm, tiny_model,
                                                              store_dir):
    sem._cascade.flush()
    image = make_test_image(20)
    restarted = _frontend(cached_llm, tiny_model, store_dir)
    assert _ask(restarted, _req(image, PARAPHRASE)).report.hit_tier == "semantic_text"
    near = ImageChops.offset(make_test_image(21), 4, 3)
    assert _ask(restarted, _req(near, QUESTION)).report.hit_tier in ("embedding:vision",
                                                                      "text:exact")
    strict = _frontend(cached_llm, tiny_model, store_dir, semantic_text_threshold=0.99,
                       prompt_threshold=0.99, image_threshold=0.99)
    near2 = ImageChops.offset(make_test_image(21), 5, 2)
    out = _ask(strict, _req(near2, QUESTION))
    assert out.report.statuses["embedding:vision"] == "miss"
    out = _ask(strict, _req(image, PARAPHRASE))
    assert out.report.hit_tier is None and out.report.statuses["semantic_text"] == "miss"


def test_evicted_canonical_images_leave_the_index(cached_llm, tiny_model, tmp_path):
    small = _frontend(cached_llm, tiny_model, tmp_path, image_store_budget=2 * 224 * 224 * 3)
    images = [make_test_image(s) for s in (30, 31, 32)]
    for image in images:
        _ask(small, _req(image, QUESTION))
    assert len(small._cascade.image.index) == 2
    out = _ask(small, _req(ImageChops.offset(images[0], 4, 3), QUESTION))
    assert out.report.statuses["embedding:vision"] == "miss"  # its canonical was evicted
