"""The proxy's routing (issue 35): cache affinity on the canonical key, fallback, round robin."""

from __future__ import annotations

import json

import pytest

from vlmcache.serving.routing import POLICIES, Router, check_policy, routing_key

URLS = ["http://a:1", "http://b:2", "http://c:3"]


def body(*uuids: str, salt: str | None = "s1", text: str = "what is it?") -> dict:
    parts = [{"type": "image_url", "image_url": {"url": "data:x"}, "uuid": u} for u in uuids]
    out: dict = {"model": "m", "messages": [{"role": "user", "content": [
        *parts, {"type": "text", "text": text}]}]}
    if salt is not None:
        out["cache_salt"] = salt
    return out


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_the_key_follows_the_media_identities_not_the_question_or_the_bytes():
    a = routing_key(body("vlmc-1", text="q one"))
    assert a == routing_key(body("vlmc-1", text="another question"))  # a follow-up
    assert a == routing_key(json.dumps(body("vlmc-1")).encode())  # bytes as forwarded
    assert a != routing_key(body("vlmc-2"))
    assert a != routing_key(body("vlmc-1", salt="s2"))  # tenant-bound
    assert a != routing_key(body("vlmc-1", salt=None))


def test_without_media_the_prompt_prefix_is_the_key():
    chat = {"model": "m", "messages": [{"role": "user", "content": "x" * 600 + "tail one"}]}
    other = {"model": "m", "messages": [{"role": "user", "content": "x" * 600 + "tail two"}]}
    assert routing_key(chat) == routing_key(other) is not None  # same 512-char prefix
    assert routing_key({"model": "m", "prompt": "hello"}) != routing_key(
        {"model": "m", "prompt": "hello", "cache_salt": "t"})
    for nothing in (b"", b"not json", b"[1]", b"{bad", {"model": "m"}):
        assert routing_key(nothing) is None


def test_the_same_key_goes_to_the_same_upstream_and_keys_spread():
    router = Router(URLS)
    keys = [routing_key(body(f"vlmc-{k}")) for k in range(60)]
    first = [router.choose(k) for k in keys]
    assert [router.choose(k) for k in keys] == first
    assert first == [router.preferred(k) for k in keys]
    assert all(n > 10 for n in router.chosen)  # ~1/3 each
    assert router.fallbacks == 0


def test_an_overloaded_preferred_upstream_is_passed_over_then_taken_back():
    router = Router(URLS, slack=2, factor=2.0)
    key = routing_key(body("vlmc-hot"))
    pref = router.preferred(key)
    for _ in range(3):  # 3 in flight on it, 0 elsewhere: above 2 * 0 + 2
        router.started(pref)
    moved = router.choose(key)
    assert moved != pref and router.fallbacks == 1
    assert router.choose(key) == moved  # the key's second choice, stable
    router.finished(pref)  # 2 in flight: within the bound again
    assert router.choose(key) == pref
    for i in range(3):  # 2 more everywhere: the bound is 2 * 2 + 2 = 6 for its 4
        router.started(i)
        router.started(i)
    assert router.choose(key) == pref


def test_a_down_upstream_is_skipped_until_its_time_is_up():
    clock = Clock()
    router = Router(URLS, down_s=5.0, clock=clock)
    key = routing_key(body("vlmc-9"))
    pref = router.preferred(key)
    router.failed(pref)
    assert router.is_down(pref) and router.choose(key) != pref
    assert router.choose(key, exclude=[router.choose(key)]) not in (pref,)
    clock.t = 5.1
    assert router.choose(key) == pref
    for i in range(3):  # all down: still answers (the least loaded of those not tried)
        router.failed(i)
    assert router.choose(key, exclude=[0, 1]) == 2


def test_round_robin_is_unchanged():
    router = Router(URLS, policy="round_robin")
    router.started(0)
    router.started(0)
    router.failed(1)
    key = routing_key(body("vlmc-1"))
    assert [router.choose(key) for _ in range(7)] == [0, 1, 2, 0, 1, 2, 0]


def test_a_request_without_key_goes_to_the_least_loaded():
    router = Router(URLS)
    router.started(0)
    router.started(1)
    assert router.choose(None) == 2


def test_policies_are_validated_by_name():
    assert POLICIES == ("affinity", "round_robin") and check_policy("affinity") == "affinity"
    with pytest.raises(ValueError, match="affinity, round_robin.*'random'"):
        Router(URLS, policy="random")
    with pytest.raises(ValueError, match="at least one upstream"):
        Router([])
    with pytest.raises(ValueError, match="factor >= 1"):
        Router(URLS, factor=0.5)
