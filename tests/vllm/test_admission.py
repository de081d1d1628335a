"""Second-sight admission in front of vLLM's offloading manager (a fake manager, no vLLM)."""

from vlmcache.vllm.admission import SecondSightManager


class _Manager:
    def __init__(self):
        self.offered = []

    def prepare_store(self, keys, req_context):
        self.offered.append(list(keys))
        return f"stored {len(keys)}"

    def lookup(self, key, req_context):
        return "MISS"


def test_a_block_is_stored_the_second_time_it_is_offered():
    inner = _Manager()
    manager = SecondSightManager(inner, ghost_entries=16)
    assert manager.prepare_store([b"a", b"b"], None) == "stored 0"
    assert manager.prepare_store([b"b", b"c"], None) == "stored 1"
    assert inner.offered == [[], [b"b"]] and manager.not_admitted == 3
    assert manager.lookup(b"a", None) == "MISS"  # everything else goes through


def test_the_filter_forgets_beyond_its_size():
    inner = _Manager()
    manager = SecondSightManager(inner, ghost_entries=2)
    manager.prepare_store([b"a", b"b", b"c"], None)  # "a" falls out
    manager.prepare_store([b"a"], None)
    assert inner.offered[-1] == []


class _Ctx:
    def __init__(self, req_id):
        self.req_id = req_id


def test_blocks_found_in_the_gpu_prefix_cache_are_neither_counted_nor_stored():
    inner = _Manager()
    resident = {}
    manager = SecondSightManager(inner, ghost_entries=16, gpu_resident=resident)
    manager.prepare_store([b"a", b"b"], _Ctx("r1"))  # computed once
    resident["r2"] = frozenset({b"a", b"b"})
    manager.prepare_store([b"a", b"b", b"c"], _Ctx("r2"))  # a GPU hit on a and b
    assert inner.offered[-1] == []  # not stored, and c was only computed once
    manager.prepare_store([b"a", b"b", b"c"], _Ctx("r3"))  # computed a second time
    assert inner.offered[-1] == [b"a", b"b", b"c"]


def test_gpu_resident_blocks_count_where_the_persistent_tier_would_keep_them():
    inner = _Manager()
    asked = []
    manager = SecondSightManager(inner, ghost_entries=16, gpu_resident={"r2": frozenset({b"a"})},
                                 capture_resident=lambda n: asked.append(n) or True)
    manager.prepare_store([b"a"], _Ctx("r1"))
    manager.prepare_store([b"a"], _Ctx("r2"))  # a GPU hit, but persisting pays: captured
    assert inner.offered == [[], [b"a"]] and asked == [1]
