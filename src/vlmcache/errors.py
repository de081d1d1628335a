"""Exceptions that vlmcache raises to its callers.

Cache faults (a corrupt chunk, a full disk) are never raised: they are misses and log lines.
What is raised is a caller's mistake: a bad config value or a malformed request.
"""

from __future__ import annotations


class VlmCacheError(Exception):
    """Base class of every error vlmcache raises."""


class ConfigError(VlmCacheError, ValueError):
    """A configuration value is invalid; the message names the key and what is allowed."""


class RequestError(VlmCacheError, ValueError):
    """A request cannot be served as given; the message names the field and the problem."""


class RequestTooLarge(RequestError):
    """A request, or a medium in it, over one of the front's size limits (a 413)."""


class MissingDependencyError(VlmCacheError, ImportError):
    """An optional dependency is not installed; the message says how to install it."""


def require(module: str, extra: str) -> object:
    """Import ``module`` or raise :class:`MissingDependencyError` naming the extra to install."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingDependencyError(
            f"{module!r} is needed for this feature: pip install 'vlmcache[{extra}]'"
        ) from exc
