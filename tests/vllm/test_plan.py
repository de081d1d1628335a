from vlmcache.keys import MultiModalSpan
from vlmcache.vllm.plan import KVPlanner, RequestView

BS = 32


def view(rid="r1", n=330, tenant=None, bypass=False, image="img"):
    return RequestView(rid, list(range(n)), (MultiModalSpan(image, 5, 256),), tenant, bypass)


def planner(stored=None, **kw):
    stored = set() if stored is None else stored
    return KVPlanner("ns", BS, stored.__contains__, **kw), stored


def test_lookup_counts_consecutive_stored_blocks_and_is_pure():
    p, stored = planner()
    keys = p.keys_for(view())
    assert len(keys) == 10
    assert p.lookup(view(), 0) == 0
    stored.update(keys[:4])
    assert p.lookup(view(), 0) == 4 * BS
    assert p.lookup(view(), 0) == 4 * BS  # repeated calls agree
    stored.add(keys[5])  # a gap stops the prefix
    assert p.lookup(view(), 0) == 4 * BS
    assert p.lookup(view(), 2 * BS) == 2 * BS  # vLLM's prefix cache had 2 blocks
    assert p.lookup(view(), 2 * BS + 1) == 0  # unaligned: nothing


def test_lookup_never_claims_the_last_token():
    p, stored = planner()
    v = view(n=320)  # exactly 10 blocks: the last block must be computed
    stored.update(p.keys_for(v))
    assert p.lookup(v, 0) == 9 * BS


def test_other_image_tenant_or_bypass_misses():
    p, stored = planner()
    stored.update(p.keys_for(view()))
    assert p.lookup(view(), 0) == 10 * BS
    assert p.lookup(view(image="other"), 0) == 0
    assert p.lookup(view(tenant="t1"), 0) == 0
    assert p.lookup(view(bypass=True), 0) == 0
    assert planner(stored, load_enabled=False)[0].lookup(view(), 0) == 0
    assert planner(stored, min_load_tokens=11 * BS)[0].lookup(view(), 0) == 0


def test_miss_saves_all_full_prompt_blocks_once():
    p, stored = planner()
    p.on_allocated(view(), 0)
    step = p.on_scheduled("r1", list(range(100, 111)), True, 0, 330)
    assert not step.loads
    (save,) = step.saves
    assert save.block_ids == tuple(range(100, 110)) and len(save.keys) == 10
    stored.update(save.keys)
    assert p.on_scheduled("r1", None, False, 330, 1).saves == ()  # decode step: nothing new
    reuse = p.finish("r1")
    assert reuse.blocks_saved == 10 and reuse.tokens_loaded == 0
    assert reuse.chunk_keys == tuple(save.keys)
    assert p.finish("r1") is None


def test_chunked_prefill_saves_blocks_as_they_complete():
    p, _ = planner()
    p.on_allocated(view(), 0)
    first = p.on_scheduled("r1", [1, 2, 3], True, 0, 80)  # 2 full blocks done
    assert first.saves[0].block_ids == (1, 2)
    second = p.on_scheduled("r1", list(range(4, 12)), False, 80, 250)
    assert second.saves[0].block_ids == tuple(range(3, 11))


def test_hit_loads_stored_prefix_then_saves_rest():
    p, stored = planner()
    keys = p.keys_for(view())
    stored.update(keys[:6])
    n = p.lookup(view(), 0)
    p.on_allocated(view(), n)
    step = p.on_scheduled("r1", list(range(200, 211)), True, n, 330 - n)
    (load,) = step.loads
    assert load.block_ids == tuple(range(200, 206)) and load.keys == tuple(keys[:6])
    assert step.saves[0].block_ids == tuple(range(206, 210))
    reuse = p.finish("r1")
    assert reuse.tokens_loaded == 6 * BS and reuse.blocks_saved == 4
    assert reuse.tokens_from_prefix_cache == 0


def test_load_after_prefix_cache_blocks():
    p, stored = planner()
    keys = p.keys_for(view())
    stored.update(keys)
    n = p.lookup(view(), 3 * BS)
    assert n == 7 * BS
    p.on_allocated(view(), n)
    step = p.on_scheduled("r1", list(range(11)), True, 3 * BS + n, 330 - 10 * BS)
    assert step.loads[0].block_ids == tuple(range(3, 10))
    reuse = p.finish("r1")
    assert reuse.tokens_from_prefix_cache == 3 * BS and reuse.tokens_loaded == 7 * BS


def test_load_errors_are_attributed_and_not_reported_as_loaded():
    p, stored = planner()
    stored.update(p.keys_for(view()))
    n = p.lookup(view(), 0)
    p.on_allocated(view(), n)
    p.on_scheduled("r1", list(range(50, 61)), True, n, 330 - n)
    p.on_load_errors({53, 54})
    # vLLM recomputes from the first failed block: those blocks are saved again,
    # even though (corrupt) copies still exist in the store
    step = p.on_scheduled("r1", None, False, 3 * BS, 330 - 3 * BS)
    assert step.saves[0].block_ids == (53, 54)
    reuse = p.finish("r1")
    assert reuse.load_failed_blocks == 2 and reuse.tokens_loaded == 0


def test_bypass_neither_loads_nor_saves():
    p, _ = planner()
    p.on_allocated(view(bypass=True), 0)
    assert p.on_scheduled("r1", list(range(11)), True, 0, 330).saves == ()
    assert p.finish("r1").bypass


def test_unknown_request_is_ignored():
    p, _ = planner()
    assert p.on_scheduled("nope", [1], True, 0, 10).loads == ()


def test_lookup_promises_only_available_chunks():
    stored = set()
    readable = set()
    p = KVPlanner("ns", BS, stored.__contains__, readable.__contains__)
    keys = p.keys_for(view())
    stored.update(keys)  # present, but only the first 3 verify
    readable.update(keys[:3])
    assert p.lookup(view(), 0) == 3 * BS
