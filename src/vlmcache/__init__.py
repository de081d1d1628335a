"""vlmcache: persistent, tenant-safe KV and encoder caching for VLMs served with vLLM."""

from vlmcache.config import VlmCacheConfig
from vlmcache.errors import ConfigError, MissingDependencyError, RequestError, VlmCacheError

__version__ = "0.1.0"

__all__ = [
    "CachedLLM", "CachedOutput", "ConfigError", "MissingDependencyError", "RequestError",
    "ReuseReport", "VlmCacheConfig", "VlmCacheError", "VlmRequest", "__version__",
]


def __getattr__(name: str) -> object:
    # The API imports vLLM lazily: config, keys and stores work without it.
    if name in ("CachedLLM", "CachedOutput", "VlmRequest"):
        from vlmcache import api

        return getattr(api, name)
    if name == "ReuseReport":
        from vlmcache.report import ReuseReport

        return ReuseReport
    raise AttributeError(f"module 'vlmcache' has no attribute {name!r}")
