"""rediss:// with a CA file: verified TLS works; an unverifiable server is a miss, not a crash."""

from __future__ import annotations

import shutil

import pytest

from vlmcache.config import VlmCacheConfig
from vlmcache.store.redis_link import FAILED, RedisLink, RedisSettings
from vlmcache.testing.redis_server import RedisServer, make_test_certificates


@pytest.fixture(scope="module")
def tls_redis(redis_server, tmp_path_factory):
    if shutil.which("openssl") is None:
        pytest.skip("the openssl tool is needed to make test certificates")
    files = make_test_certificates(tmp_path_factory.mktemp("tls"))
    server = RedisServer(tls=files)
    server.start()
    yield server, files
    server.stop()


def test_tls_with_the_ca_file(tls_redis):
    server, (_, _, ca) = tls_redis
    cfg = VlmCacheConfig(redis_url=server.url, redis_tls_ca_file=str(ca),
                         redis_connect_timeout_ms=500, redis_timeout_ms=500)
    link = RedisLink(RedisSettings.from_config(cfg))
    assert server.url.startswith("rediss://")
    assert link.call("set", lambda c: c.set("k", b"v")) is True
    assert link.call("get", lambda c: c.get("k")) == b"v"


def test_tls_without_trust_is_a_failure_not_an_exception(tls_redis):
    server, _ = tls_redis
    link = RedisLink(RedisSettings(url=server.url, connect_timeout_s=0.5, timeout_s=0.5))
    assert link.call("get", lambda c: c.get("k")) is FAILED  # self-signed CA not trusted
    assert not link.up
