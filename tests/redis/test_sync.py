"""Two replicas' cascades sharing exact, image and paraphrase records through one Redis."""

from __future__ import annotations

import numpy as np
import pytest

from vlmcache.cascade import Cascade, CascadeRequest
from vlmcache.config import VlmCacheConfig
from vlmcache.embedders import Memoized, make_image_embedder, text_digest
from vlmcache.keys import image_content_hash
from vlmcache.shared.replicator import wait_for
from vlmcache.shared.responses import LayeredRecordStore, shared_record_store
from vlmcache.shared.sync import SharedExactTier, share_cascade
from vlmcache.store.disk import DiskStore
from vlmcache.store.memory import MemoryStore
from vlmcache.store.tiered import TieredStore
from vlmcache.testing.text_embedder import HashedBagOfWords
from vlmcache.tiers.exact import ExactTextTier
from vlmcache.tiers.image_embedding import ImageEmbeddingTier
from vlmcache.tiers.response import LocalRecordStore
from vlmcache.tiers.semantic_text import PROMPT_LAYER, QUESTION_LAYER, SemanticTextTier

pytest.importorskip("faiss")
NS = "ab" * 32
PROMPT = "USER: <image>\nWhat color is the square? ASSISTANT:"


def _config(tmp_path, url: str, name: str) -> VlmCacheConfig:
    return VlmCacheConfig(store_path=str(tmp_path / name), redis_url=url, redis_prefix="t",
                          redis_timeout_ms=200, redis_sync_interval_s=0.05)


@pytest.fixture()
def replicas():
    made = []
    yield made
    for rep in made:
        rep.close()


def _replica(tmp_path, url: str, name: str, made: list):
    cfg = _config(tmp_path, url, name)
    root = cfg.store_dir
    exact = ExactTextTier(root / "exact.jsonl", NS, 1000)
    store = TieredStore(MemoryStore(10_000_000), DiskStore(root / "images", 10**8),
                        name="images")
    image = ImageEmbeddingTier(root / "image_index" / "ix",
                               NS, Memoized(make_image_embedder("phash"), image_content_hash),
                               store, 0.85)
    text = SemanticTextTier(root / "semantic", NS, Memoized(HashedBagOfWords(), text_digest),
                            {QUESTION_LAYER: 0.8, PROMPT_LAYER: 0.8})
    cascade = Cascade(exact, image, text)
    replicator = share_cascade(cascade, cfg, NS)
    assert replicator is not None
    made.append(replicator)
    return cascade, replicator


def _image(seed: int):
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8), "RGB")


def test_no_url_means_no_sharing(tmp_path):
    cascade = Cascade(None)
    assert share_cascade(cascade, VlmCacheConfig(store_path=str(tmp_path)), NS) is None
    assert cascade.exact is None


def test_exact_image_and_paraphrase_records_reach_the_other_replica(tmp_path, live_redis, replicas):
    a, rep_a = _replica(tmp_path, live_redis.url, "a", replicas)
    b, rep_b = _replica(tmp_path, live_redis.url, "b", replicas)
    assert isinstance(a.exact, SharedExactTier)
    img = _image(1)
    h = image_content_hash(img)
    # replica A serves two requests: an exact record, a canonical image and question
    a.capture(PROMPT, [h], "tenant-1", ["cd" * 32], 40)
    res = a.resolve(PROMPT, [h], "tenant-1", images=[img])
    assert res.hit_tier == "text:exact"  # A's own record
    q2, p2 = "How big is the square?", "USER: <image>\nHow big is the square? ASSISTANT:"
    miss = a.resolve(p2, [h], "tenant-1", images=[img], question=q2)
    assert miss.hit_tier is None
    a.remember(CascadeRequest(p2, (h,), "tenant-1", (img,), q2), miss)
    assert wait_for(lambda: rep_b.stats().applied >= 3, 5)
    # B now answers A's request exactly, A's image canonically, A's question by paraphrase
    hit = b.resolve("USER: <image>\nWhat  color is the square?  ASSISTANT:", [h], "tenant-1")
    assert hit.hit_tier == "text:exact" and hit.prompt == PROMPT
    assert b.image.lookup(img, h, "tenant-1") is not None
    para = b.resolve("USER: <image>\nhow big is the square ASSISTANT:", [h], "tenant-1",
                     images=[img], question="how big is the square")
    assert para.hit_tier in (QUESTION_LAYER, PROMPT_LAYER)
    # tenants stay apart on the receiving side too
    assert b.resolve(PROMPT, [h], "tenant-2").hit_tier is None
    assert rep_a.stats().published >= 3 and rep_b.stats().apply_failed == 0


def test_sharing_resumes_after_a_redis_restart(tmp_path, live_redis, replicas):
    a, rep_a = _replica(tmp_path, live_redis.url, "a", replicas)
    b, rep_b = _replica(tmp_path, live_redis.url, "b", replicas)
    a.capture("before the kill", [], None, [], 3)
    assert wait_for(lambda: b.resolve("before the kill", [], None).hit_tier == "text:exact", 5)
    live_redis.kill()
    a.capture("made while down", [], None, [], 3)  # kept pending, not lost
    assert wait_for(lambda: rep_a.log.stats().publish_failed >= 1, 5)
    assert rep_a.pending() == 1
    assert a.resolve("made while down", [], None).hit_tier == "text:exact"  # local still
    live_redis.start()  # empty: what was published before is gone from Redis
    a.capture("after restart", [], None, [], 3)
    for prompt in ("made while down", "after restart"):
        assert wait_for(lambda: b.resolve(prompt, [], None).hit_tier == "text:exact", 10)
    assert rep_a.pending() == 0 and rep_a.stats().dropped == 0


def test_responses_are_shared_and_local_first(tmp_path, live_redis):
    cfg = _config(tmp_path, live_redis.url, "a")
    a = shared_record_store(cfg, LocalRecordStore(1_000_000))
    b = shared_record_store(cfg, LocalRecordStore(1_000_000))
    assert isinstance(a, LayeredRecordStore)
    key = "ef" * 32
    assert a.put(key, b'{"answer": 1}', 30.0)
    assert b.get(key) == b'{"answer": 1}' and b.shared_hits == 1
    assert b.get(key) == b'{"answer": 1}' and b.shared_hits == 1  # now local
    live_redis.kill()
    assert b.get(key) == b'{"answer": 1}'  # local copy still serves
    assert a.get("00" * 32) is None  # a miss within the timeout, not an error
    live_redis.start()
    b.delete(key)
    assert a.local.get(key) is not None and b.get(key) is None
    assert shared_record_store(VlmCacheConfig(store_path=str(tmp_path)), "x") == "x"
