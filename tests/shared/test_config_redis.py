"""The Redis block of the config: URLs never carry passwords; errors name the key."""

from __future__ import annotations

import pytest

from vlmcache.config import VlmCacheConfig
from vlmcache.errors import ConfigError


def test_defaults_keep_everything_local():
    cfg = VlmCacheConfig()
    assert cfg.redis_url is None and cfg.redis_timeout_ms == 20.0


@pytest.mark.parametrize("url, words", [
    ("redis://:hunter2@h:6379/0", "must not contain a password"),
    ("redis://u:hunter2@h:6379/0", "must not contain a password"),
    ("rediss://h:6379/0?password=hunter2", "must not contain a password"),
    ("http://h:6379/0", "scheme must be one of"),
    ("redis://h:port/0", "not a valid URL"),
])
def test_bad_urls_refused_without_echoing_secrets(url, words):
    with pytest.raises(ConfigError) as err:
        VlmCacheConfig(redis_url=url)
    assert words in str(err.value) and "hunter2" not in str(err.value)
    assert str(err.value).startswith("redis_url")


def test_sizes_and_limits():
    cfg = VlmCacheConfig.from_dict({"redis_url": "unix:///run/redis.sock",
                                    "redis_kv_budget": "2GiB", "redis_image_budget": "10MB"})
    assert cfg.redis_kv_budget == 2 * 1024**3 and cfg.redis_image_budget == 10_000_000
    for key, bad in (("redis_timeout_ms", 0), ("redis_log_max_entries", 0),
                     ("redis_prefix", "a b"), ("redis_kv_budget", 0)):
        with pytest.raises(ConfigError, match=key):
            VlmCacheConfig.from_dict({key: bad})
