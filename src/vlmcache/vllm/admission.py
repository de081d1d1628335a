"""Second-sight admission for vLLM's CPU offload region (``admission_memory: second_sight``).

vLLM's native CPU offloading has ``store_threshold`` for this; its tiering spec (which
vlmcache's spec extends) refuses it. Capturing a prompt's KV costs GPU->CPU copies for every
block a miss computes: measured on an H100 with a LLaVA-1.5-7B shape (512 KiB of KV per
token), 20% of batch prefill throughput. With second sight a block is stored only the second
time it is computed (the prompt came back after the GPU evicted it, or another request
recomputed the prefix), so one-off prompts cost no copies.

A block a request found in vLLM's GPU prefix cache is offered for storing too, but copying it
out puts the whole capture on that hit (measured on an H100, LLaVA-1.5-7B shape, CUDA graphs:
27.5 ms against vLLM's own 17.4 ms hit, 352 MB copied). Such a block counts as a sighting only
where the persistent tier would keep it (its cost model says a load would beat recompute):
then the copy buys reuse across restarts and replicas. Elsewhere only computations count,
which is the meaning of vLLM's own ``store_threshold`` (it counts lookups, and vLLM looks up
only what its GPU cache lacks).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Collection, Mapping
from typing import Any

from vlmcache.store.policy import GhostFilter
from vlmcache.vllm.compat import delegate


class SecondSightManager:
    """vLLM's ``OffloadingManager`` with stores admitted on second computation; every other
    call goes to the wrapped manager unchanged.

    ``gpu_resident`` maps a request id to the offload keys that request found in vLLM's GPU
    prefix cache (the connector fills it when it first sees the request): those are neither
    counted nor stored unless ``capture_resident(n)`` says ``n`` such chunks are worth
    persisting."""

    def __init__(self, inner: Any, ghost_entries: int,
                 gpu_resident: Mapping[str, frozenset[bytes]] | None = None,
                 capture_resident: Callable[[int], bool] | None = None) -> None:
        self._inner = inner
        self._ghost = GhostFilter(ghost_entries)
        self._lock = threading.Lock()
        self._gpu_resident = gpu_resident if gpu_resident is not None else {}
        self._capture_resident = capture_resident or (lambda n: False)
        self.not_admitted = 0

    def prepare_store(self, keys: Collection[Any], req_context: Any) -> Any:
        resident = self._gpu_resident.get(getattr(req_context, "req_id", ""), frozenset())
        if resident and self._capture_resident(len(resident)):
            resident = frozenset()
        with self._lock:
            admitted = [k for k in keys
                        if bytes(k) not in resident and self._ghost.second_sight(bytes(k))]
            self.not_admitted += len(keys) - len(admitted)
        # an empty list still goes through: vLLM's manager answers it with nothing to store
        return self._inner.prepare_store(admitted, req_context)

    def __getattr__(self, name: str) -> Any:
        return delegate(self, self._inner, name)
