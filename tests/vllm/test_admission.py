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
