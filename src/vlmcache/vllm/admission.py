"""Second-sight admission for vLLM's CPU offload region (``admission_memory: second_sight``).

vLLM's native CPU offloading has ``store_threshold`` for this; its tiering spec (which
vlmcache's spec extends) refuses it. Capturing a prompt's KV costs GPU->CPU copies for every
block a miss computes: measured on an H100 with a LLaVA-1.5-7B shape (512 KiB of KV per
token), 20% of batch prefill throughput. With second sight a block is stored only the second
time vLLM offers it (it was computed twice: the prompt came back after the GPU evicted it,
or another request shares the prefix), so one-off prompts cost no copies.
"""

from __future__ import annotations

import threading
from collections.abc import Collection
from typing import Any

from vlmcache.store.policy import GhostFilter


class SecondSightManager:
    """vLLM's ``OffloadingManager`` with stores admitted on second sight; every other call
    goes to the wrapped manager unchanged."""

    def __init__(self, inner: Any, ghost_entries: int) -> None:
        self._inner = inner
        self._ghost = GhostFilter(ghost_entries)
        self._lock = threading.Lock()
        self.not_admitted = 0

    def prepare_store(self, keys: Collection[Any], req_context: Any) -> Any:
        with self._lock:
            admitted = [k for k in keys if self._ghost.second_sight(bytes(k))]
            self.not_admitted += len(keys) - len(admitted)
        # an empty list still goes through: vLLM's manager answers it with nothing to store
        return self._inner.prepare_store(admitted, req_context)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)
