"""A real redis-server for the lab's Redis fault tests: one per session, on a free loopback port."""

from vlmcache.testing.redis_fixtures import live_redis, redis_server  # noqa: F401
