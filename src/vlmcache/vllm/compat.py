"""Differences between the vLLM versions vlmcache supports (0.26 on GPUs to 0.32 on CPUs).

Every version check lives here; the connectors call these functions instead of branching.
"""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger(__name__)

SUPPORTED = ((0, 26), (0, 32))


def vllm_version() -> tuple[int, int]:
    """The installed vLLM's (major, minor)."""
    import vllm

    parts = vllm.__version__.split(".")
    try:
        return int(parts[0]), int(parts[1])
    except (IndexError, ValueError):
        return SUPPORTED[1]


def check_supported() -> None:
    version = vllm_version()
    if not SUPPORTED[0] <= version <= SUPPORTED[1]:
        logger.warning("vLLM %d.%d is outside the versions vlmcache was tested with "
                       "(%d.%d to %d.%d)", *version, *SUPPORTED[0], *SUPPORTED[1])


def init_connector_base(connector: Any, base: type, vllm_config: Any, role: Any,
                        kv_cache_config: Any) -> None:
    """Call ``KVConnectorBase_V1.__init__``; its signature gained ``kv_cache_config``."""
    try:
        base.__init__(connector, vllm_config=vllm_config, role=role,
                      kv_cache_config=kv_cache_config)
    except TypeError:
        base.__init__(connector, vllm_config=vllm_config, role=role)


def block_dim_hint() -> int:
    """Where paged KV keeps its block dimension when the shape alone cannot tell.

    vLLM 0.32 hands connectors per-layer views with blocks first; older GPU backends keep
    keys and values first (``[2, num_blocks, ...]``).
    """
    return 0 if vllm_version() >= (0, 30) else 1


def num_kv_blocks(kv_cache_config: Any, kv_caches: dict[str, Any]) -> int:
    """The number of KV blocks vLLM allocated."""
    n = getattr(kv_cache_config, "num_blocks", None)
    if isinstance(n, int) and n > 0:
        return n
    shapes = {tuple(t.shape) for t in kv_caches.values()}
    shape = next(iter(shapes))
    return shape[0] if shape[0] != 2 else shape[1]


def cached_req_fields(cached_reqs: Any, i: int) -> tuple[str, Any, bool, int]:
    """(request id, new block ids of group 0 or None, replaces blocks?, computed tokens)."""
    req_id = cached_reqs.req_ids[i]
    new_ids = cached_reqs.new_block_ids[i]
    resumed = getattr(cached_reqs, "resumed_req_ids", None)
    if resumed is not None:
        replaced = req_id in resumed
    else:
        replaced = bool(cached_reqs.resumed_from_preemption[i])
    return req_id, (new_ids[0] if new_ids is not None else None), replaced, \
        cached_reqs.num_computed_tokens[i]
