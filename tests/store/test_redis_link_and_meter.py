"""The link's backoff state machine and the read meter, with a fake client and clock."""

from __future__ import annotations

import pytest

redis = pytest.importorskip("redis", reason="pip install 'vlmcache[redis]'")

from vlmcache.store.redis_link import BACKOFF_MIN_S, FAILED, RedisLink, RedisSettings  # noqa: E402
from vlmcache.store.read_meter import ReadMeter  # noqa: E402


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class FakeClient:
    def __init__(self) -> None:
        self.down = False
        self.calls = 0

    def get(self, key):
        self.calls += 1
        if self.down:
            raise redis.ConnectionError("refused")
        return b"v"

    def close(self):
        pass


def _link(max_s: float = 1.0):
    clock, client = Clock(), FakeClient()
    link = RedisLink(RedisSettings(url="redis://h:1/0", backoff_max_s=max_s), client, clock)
    return link, client, clock


def test_backoff_doubles_to_the_cap_and_resets():
    link, client, clock = _link(max_s=0.4)
    client.down = True
    assert link.call("get", lambda c: c.get("k")) is FAILED
    delays = []
    for _ in range(6):
        before = client.calls
        assert link.call("get", lambda c: c.get("k")) is FAILED  # inside the backoff
        assert client.calls == before  # no socket touched
        step = 0.0
        while client.calls == before:  # advance until one probe goes through
            clock.t += 0.01
            step += 0.01
            link.call("get", lambda c: c.get("k"))
        delays.append(step)
    assert delays[0] <= BACKOFF_MIN_S * 2 + 0.02  # first probe: ~50-100 ms
    assert max(delays) <= 0.4 + 0.02 and delays[-1] >= 0.2 - 0.02  # capped, with jitter
    client.down = False
    clock.t += 1.0
    assert link.call("get", lambda c: c.get("k")) == b"v"
    s = link.stats()
    assert s.up and s.reconnects == 1 and s.disconnects == 1


def test_other_exceptions_do_not_back_off():
    link, client, _ = _link()

    def boom(c):
        raise redis.ResponseError("OOM command not allowed")

    assert link.call("put", boom) is FAILED
    assert link.up and link.call("get", lambda c: c.get("k")) == b"v"


def test_meter_separates_latency_from_bandwidth():
    m = ReadMeter()
    assert m.cost().predict_s(10) is None
    for _ in range(20):
        m.observe(0.001, 100)  # small: latency 1 ms
        m.observe(0.001 + 0.01, 10_000_000)  # 10 MB in 10 ms after the latency: 1 GB/s
    cost = m.cost()
    assert cost.latency_s == pytest.approx(0.001, rel=0.05)
    assert cost.bytes_per_s == pytest.approx(1e9, rel=0.05)
    assert cost.predict_s(20_000_000) == pytest.approx(0.021, rel=0.05)


def test_recompute_gate_compares_read_with_recompute():
    from vlmcache.store.read_meter import ReadCost
    from vlmcache.store.redis_tiered import recompute_gate

    rate = [10_000.0]  # prefill tokens/s: 32 tokens take 3.2 ms
    gate = recompute_gate(lambda: rate[0], 32, prior_bytes_per_s=1e9)
    assert gate(ReadCost(0.0002, 0.0, 0), 1_000_000)  # prior: 1 MB at 1 GB/s = 1.2 ms
    slow = ReadCost(0.0002, 1e8, 5)  # measured 100 MB/s: 1 MB = 10.2 ms
    assert not gate(slow, 1_000_000)
    rate[0] = 2_000.0  # slower engine: recompute 16 ms, now the read wins
    assert gate(slow, 1_000_000)


def test_calls_in_flight_when_redis_dies_do_not_lengthen_the_backoff():
    link, client, clock = _link(max_s=5.0)
    client.down = True

    def outer(c):  # a second call, admitted while the link was up, fails first
        link.call("inner", lambda c2: c2.get("k"))
        return c.get("k")

    assert link.call("outer", outer) is FAILED
    assert link.stats().disconnects == 1 and link.stats().failures == 2
    clock.t += BACKOFF_MIN_S + 0.001  # one minimal pause, not a doubled one
    before = client.calls
    link.call("probe", lambda c: c.get("k"))
    assert client.calls == before + 1
