"""A real redis-server for the Redis tests: one per session, on a free loopback port."""

from vlmcache.testing.redis_fixtures import live_redis, redis_server  # noqa: F401
