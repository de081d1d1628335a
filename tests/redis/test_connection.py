"""The guarded Redis link: bounded time when Redis is down or hung, backoff, reconnect."""

from __future__ import annotations

import logging
import time

import pytest

from vlmcache.config import VlmCacheConfig
from vlmcache.store.redis_link import FAILED, RedisLink, RedisSettings, redact_url
from vlmcache.testing.redis_server import free_port


def _link(url: str, **kw) -> RedisLink:
    return RedisLink(RedisSettings(url=url, **kw))


def test_call_returns_result(live_redis):
    link = _link(live_redis.url, timeout_s=0.5)  # a loaded 2-core VM can miss 5 ms
    assert link.call("ping", lambda c: c.ping()) is True
    assert link.up and link.stats().failures == 0


def test_refused_connection_fails_fast_then_skips_during_backoff():
    link = _link(f"redis://127.0.0.1:{free_port()}/0")
    start = time.perf_counter()
    assert link.call("get", lambda c: c.get("x")) is FAILED
    first = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(100):
        assert link.call("get", lambda c: c.get("x")) is FAILED
    rest = time.perf_counter() - start
    stats = link.stats()
    assert not stats.up and stats.disconnects == 1
    assert stats.skipped_while_down >= 99  # no socket touched during the backoff
    assert first < 0.05 and rest < 0.05


def test_hung_server_times_out_within_bound(live_redis):
    from vlmcache.store.redis_link import warm_up

    link = _link(live_redis.url, timeout_s=0.005)
    assert warm_up(link)  # connected before the server hangs
    live_redis.pause()
    try:
        start = time.perf_counter()
        assert link.call("get", lambda c: c.get("k")) is FAILED
        assert time.perf_counter() - start < 0.05
    finally:
        live_redis.resume()


def test_reconnects_after_restart(live_redis):
    link = _link(live_redis.url, backoff_max_s=0.1, timeout_s=0.5)
    assert link.call("set", lambda c: c.set("k", b"v")) is True
    live_redis.kill()
    assert link.call("get", lambda c: c.get("k")) is FAILED
    live_redis.start()
    deadline = time.monotonic() + 5
    while link.call("ping", lambda c: c.ping()) is FAILED:
        assert time.monotonic() < deadline, "link never came back"
        time.sleep(0.02)
    stats = link.stats()
    assert stats.up and stats.reconnects == 1
    assert link.call("get", lambda c: c.get("k")) is None  # restarted empty


def test_command_error_does_not_take_the_link_down(live_redis):
    link = _link(live_redis.url, timeout_s=0.5)
    assert link.call("bad", lambda c: c.execute_command("NOSUCHCOMMAND")) is FAILED
    assert link.up and link.stats().rejected == 1
    assert link.call("ping", lambda c: c.ping()) is True


def test_password_from_environment_never_shown(live_redis, monkeypatch, caplog):
    client = live_redis.client()
    client.config_set("requirepass", "s3cret-pw")
    try:
        monkeypatch.setenv("VLMC_TEST_PW", "s3cret-pw")
        link = _link(live_redis.url, password_env="VLMC_TEST_PW", timeout_s=0.5)
        assert link.call("ping", lambda c: c.ping()) is True
        monkeypatch.setenv("VLMC_TEST_PW", "b4d-pw-xyz")
        bad = _link(live_redis.url, password_env="VLMC_TEST_PW")
        with caplog.at_level(logging.DEBUG):
            assert bad.call("ping", lambda c: c.ping()) is FAILED
        assert "redis" in caplog.text  # the outage was logged...
        shown = repr(link) + repr(link.settings) + repr(bad) + caplog.text
        assert "s3cret-pw" not in shown and "b4d-pw-xyz" not in shown  # ...not the password
    finally:
        import redis as redis_lib

        authed = redis_lib.Redis.from_url(live_redis.url, password="s3cret-pw")
        authed.config_set("requirepass", "")
        authed.close()


def test_config_builds_settings():
    cfg = VlmCacheConfig(redis_url="redis://10.0.0.5:6380/2", redis_timeout_ms=7)
    settings = RedisSettings.from_config(cfg)
    assert settings.timeout_s == pytest.approx(0.007)
    assert settings.safe_url == "redis://10.0.0.5:6380/2"
    assert redact_url("rediss://user@host:1/0") == "rediss://host:1/0"


def test_warm_up_opens_a_pooled_connection_outside_the_link_state(live_redis):
    from vlmcache.store.redis_link import warm_up

    link = _link(live_redis.url, timeout_s=0.5)
    assert warm_up(link, attempts=5)
    assert link.stats().calls == 0  # not counted as a call, no latency sample
    pool = link.client.connection_pool
    assert len(pool._available_connections) == 1  # the first request reuses it
    live_redis.kill()
    assert not warm_up(_link(live_redis.url), attempts=2, pause_s=0.01)
