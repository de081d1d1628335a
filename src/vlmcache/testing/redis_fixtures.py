"""pytest fixtures for a real redis-server on loopback (``tests/`` and ``benchmarks/tests/``).

Tests skip (with the reason) only when ``redis-server`` is not installed. Each test gets
an emptied, running server; a test that kills or pauses it leaves it to this fixture to
bring back.
"""

from __future__ import annotations

import pytest

from vlmcache.testing.redis_server import RedisServer, redis_server_path


@pytest.fixture(scope="session")
def redis_server():
    if redis_server_path() is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server, or run "
                    "scripts/setup.sh as root)")
    pytest.importorskip("redis", reason="the redis client is missing: pip install "
                                        "'vlmcache[redis]'")
    server = RedisServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture()
def live_redis(redis_server):
    """The session's server, running and empty."""
    redis_server.resume()
    if not redis_server.alive():
        redis_server.start()
    client = redis_server.client()
    client.flushall()
    client.close()
    yield redis_server
    redis_server.resume()
    if not redis_server.alive():
        redis_server.start()
