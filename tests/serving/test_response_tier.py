from vlmcache.tiers.response import (LocalRecordStore, ResponseTier, canonical_request,
                                     is_deterministic)


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_local_store_expires_by_ttl_and_evicts_by_bytes():
    clock = Clock()
    store = LocalRecordStore(max_bytes=10, clock=clock)
    assert store.put("a", b"12345", ttl_s=5) and store.get("a") == b"12345"
    clock.t = 5.0
    assert store.get("a") is None and len(store) == 0
    store.put("a", b"12345", 100)
    store.put("b", b"12345", 100)
    store.get("a")  # a is now the most recent
    store.put("c", b"123", 100)
    assert store.get("b") is None and store.get("a") and store.get("c")
    assert store.occupancy_bytes == 8 and store.evictions == 1
    assert not store.put("big", b"x" * 11, 100) and not store.put("z", b"x", 0)
    store.delete("a")
    assert store.get("a") is None


def test_records_are_bound_to_namespace_and_tenant_and_verified():
    store = LocalRecordStore(1 << 20)
    tier = ResponseTier(store, "ns", 60, 1 << 16)
    key = tier.key(canonical_request("chat", {"messages": [1]}), "A")
    assert key != tier.key(canonical_request("chat", {"messages": [1]}), "B")
    assert key != tier.key(canonical_request("chat", {"messages": [1]}), None)
    assert key != ResponseTier(store, "ns2", 60, 1).key(
        canonical_request("chat", {"messages": [1]}), "A")
    assert tier.record(key, {"choices": [{"text": "x"}]})
    assert tier.lookup(key) == {"choices": [{"text": "x"}]}
    store.put(key, store.get(key).replace(b'\\"x\\"', b'\\"y\\"'), 60)  # tampered body
    assert tier.lookup(key) is None and store.get(key) is None
    assert not tier.record(key, {"choices": ["x" * 70000]})  # over max_entry_bytes


def test_canonical_request_ignores_transport_fields_only():
    a = canonical_request("chat", {"messages": [], "stream": True, "vlmcache": {"x": 1},
                                   "temperature": 0})
    assert a == canonical_request("chat", {"temperature": 0, "messages": []})
    assert a != canonical_request("chat", {"temperature": 0, "messages": [], "max_tokens": 3})
    assert a != canonical_request("completions", {"temperature": 0, "messages": []})


def test_only_greedy_or_seeded_single_choice_requests_are_deterministic():
    assert is_deterministic({"temperature": 0})
    assert is_deterministic({"temperature": 0.8, "seed": 3})
    assert not is_deterministic({})
    assert not is_deterministic({"temperature": 0.2})
    assert not is_deterministic({"temperature": 0, "n": 2})
    assert not is_deterministic({"temperature": False})


def test_a_failing_store_is_a_miss():
    class Broken:
        def get(self, key):
            raise ConnectionError("down")

        def put(self, key, value, ttl_s):
            raise ConnectionError("down")

        def delete(self, key):
            raise ConnectionError("down")

    tier = ResponseTier(Broken(), "ns", 60, 1 << 16)
    assert tier.lookup("k") is None and tier.record("k", {"a": 1}) is False
