"""The shared record log and the typed records: tailing, own-entry skip, bounds, tampering."""

from __future__ import annotations

import pytest

from vlmcache.shared import shares
from vlmcache.store.redis_link import RedisLink, RedisSettings
from vlmcache.shared.records import RecordLog


def _log(url: str, max_entries: int = 1000, origin: str | None = None) -> RecordLog:
    link = RedisLink(RedisSettings(url=url, prefix="t", timeout_s=0.5))
    return RecordLog(link, "ns1", max_entries, origin)


def test_each_replica_reads_the_others_entries_once(live_redis):
    a, b = _log(live_redis.url), _log(live_redis.url)
    assert a.publish("exact", ["1", "2"]) == 2
    assert b.publish("text", ["3"]) == 1
    got_b = b.read()
    assert [(e.kind, e.body) for e in got_b] == [("exact", "1"), ("exact", "2")]
    assert [(e.kind, e.body) for e in a.read()] == [("text", "3")]
    assert b.read() == [] and a.read() == []
    a.publish("exact", ["4"])
    assert [e.body for e in b.read()] == ["4"]
    assert b.stats().skipped_own == 1 and b.stats().read == 3


def test_a_late_replica_replays_the_bounded_history(live_redis):
    a = _log(live_redis.url, max_entries=100)
    for i in range(10):
        a.publish("exact", [str(j) for j in range(i * 100, i * 100 + 100)])
    late = _log(live_redis.url)
    seen = []
    while batch := late.read():
        seen += batch
    assert 100 <= len(seen) < 1000  # trimmed to about max_entries, newest kept
    assert seen[-1].body == "999"


def test_tampered_and_malformed_entries_are_skipped(live_redis):
    a, b = _log(live_redis.url), _log(live_redis.url)
    a.publish("exact", ["good"])
    client = live_redis.client()
    client.xadd(a.stream, {"k": "exact", "o": "evil", "b": "forged", "s": "0" * 32})
    client.xadd(a.stream, {"junk": "x"})
    a.publish("exact", ["good2"])
    assert [e.body for e in b.read()] == ["good", "good2"]
    assert b.stats().rejected == 2


def test_publish_while_down_fails_fast_and_is_counted(live_redis):
    a = _log(live_redis.url)
    live_redis.kill()
    assert a.publish("exact", ["x", "y"]) == 0
    assert a.read() == []
    assert a.stats().publish_failed == 2


def test_bad_names_refused(live_redis):
    with pytest.raises(ValueError):
        _log(live_redis.url).publish("no spaces", ["x"])
    link = RedisLink(RedisSettings(url=live_redis.url))
    with pytest.raises(ValueError):
        RecordLog(link, "../x", 10)


def test_shares_round_trip_and_strict_decoding():
    tenant = "a/../../b\0" + "x" * 65536  # hostile tenant names are just data
    for share in (shares.ExactShare("p", ("h1",), tenant, ("k",), 7),
                  shares.ImageShare("h", None, "ab" * 32),
                  shares.TextShare("q?", "USER: q?", "ctx", "t")):
        kind = shares.kind_of(share)
        assert shares.decode(kind, shares.encode(share)) == share
    assert shares.decode("exact", '{"prompt": 1}') is None
    assert shares.decode("exact", "not json") is None
    bad_tokens = shares.encode(shares.ExactShare("p", (), None, (), 1)).replace(
        '"prompt_tokens":1', '"prompt_tokens":-1')
    assert shares.decode("exact", bad_tokens) is None
    assert shares.decode("nope", "{}") is None
