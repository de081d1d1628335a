"""vlmcache's persistent tier as a secondary tier of vLLM's tiering KV offloader.

vLLM's ``TieringOffloadingManager`` calls this class beside the scheduler (EngineCore): it
cascades offloaded rows from the CPU primary tier (a shared memory region that GPU workers
fill with async DMA) into vlmcache's checksummed chunk store, and promotes stored rows back.
This class only translates vLLM's calls; the logic is :class:`~vlmcache.vllm.persist.PersistentKV`.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from vllm.v1.kv_offload.base import (
    LookupResult,
    ReqContext,
    RequestOffloadingContext,
)
from vllm.v1.kv_offload.tiering.base import JobResult, SecondaryTierManager

from vlmcache.config import VlmCacheConfig
from vlmcache.store.kvstore import open_persistent_kv_store
from vlmcache.store.redis_tiered import RedisBackedStore, recompute_gate  # issue 14B
from vlmcache.vllm import compat
from vlmcache.vllm.cost import CostModel, CostPriors
from vlmcache.vllm.io_worker import make_executor
from vlmcache.vllm.persist import PersistentKV, TierGeometry

try:  # 0.32 labels hits by medium; 0.26 has no Medium
    from vllm.v1.kv_offload.base import Medium

    _MEDIUM: Any = Medium.STORAGE
except ImportError:  # pragma: no cover - vLLM 0.26
    _MEDIUM = None

if TYPE_CHECKING:
    from vllm.v1.kv_offload.base import OffloadingSpec

logger = logging.getLogger(__name__)

TIER_TYPE = "VlmCacheTier"


#: GIL hand-over interval (s) in a GPU engine process running the tier's I/O threads.
GIL_SWITCH_INTERVAL_S = 0.0005


def _on_gpu() -> bool:
    from vllm.platforms import current_platform

    return bool(current_platform.is_cuda_alike())


def _shorten_gil_switch_interval() -> None:
    """With one GPU the model runs in the scheduler's process; when this tier's I/O runs on
    threads there (no I/O process), with Python's default 5 ms interval the step loop, which
    gives the GIL up at every CUDA sync, can wait up to 5 ms to get it back (measured: +15-50
    ms per request on an H200 with the former copy path). A short interval bounds that."""
    if sys.getswitchinterval() > GIL_SWITCH_INTERVAL_S:
        logger.info("vlmcache: GIL switch interval %.1f ms -> %.1f ms",
                    sys.getswitchinterval() * 1e3, GIL_SWITCH_INTERVAL_S * 1e3)
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


def _region_fd(spec: Any) -> int | None:
    """The descriptor of vLLM's CPU region in this process (the I/O process maps it)."""
    fd = getattr(getattr(spec, "_scheduler_mmap", None), "fd", None)
    return fd if isinstance(fd, int) else None


def _tenant(req_context: Any) -> str | None:
    """The tenant the serving front put in the request's ``kv_transfer_params``."""
    params = getattr(req_context, "kv_transfer_params", None) or {}
    ours = params.get("vlmcache") if isinstance(params, dict) else None
    tenant = ours.get("tenant") if isinstance(ours, dict) else None
    return tenant if isinstance(tenant, str) else None


def cost_model_for(config: VlmCacheConfig) -> CostModel:
    """The cost model ``config`` asks for, starting from its priors."""
    priors = CostPriors(read_bytes_per_s=config.kv_read_bytes_per_s_prior,
                        read_fixed_s=config.kv_read_fixed_s,
                        prefill_tokens_per_s=config.kv_prefill_tokens_per_s_prior)
    return CostModel(priors, enabled=config.kv_cost_model)


class VlmCacheTier(SecondaryTierManager):
    """Persistent KV rows in vlmcache's chunk store (namespaced, checksummed, budgeted)."""

    medium: ClassVar[Any] = _MEDIUM

    def __init__(self, offloading_spec: "OffloadingSpec", primary_kv_view: memoryview,
                 tier_type: str, backpressure_detector: Any = None,
                 module_path: str | None = None) -> None:
        # module_path: vLLM 0.26 passes every tier-config key through; 0.32 strips it
        super().__init__(offloading_spec=offloading_spec, primary_kv_view=primary_kv_view,
                         tier_type=tier_type, **compat.tier_base_kwargs(backpressure_detector))
        config: VlmCacheConfig | None = getattr(offloading_spec, "vlmcache", None)
        namespace = str(getattr(offloading_spec, "namespace_digest", ""))
        tokens_per_chunk = int(getattr(offloading_spec, "tokens_per_chunk", 0))
        if config is None or not namespace or tokens_per_chunk <= 0:
            raise ValueError("VlmCacheTier runs under VlmCacheOffloadingSpec, with the "
                             "namespace VlmCacheOffloadingConnector computes")
        rows = np.asarray(primary_kv_view).view(np.uint8)
        rows = rows.reshape(rows.shape[0], -1)
        self.cost: CostModel = getattr(offloading_spec, "cost_model", None) or \
            cost_model_for(config)
        store = open_persistent_kv_store(config)  # the scheduler's index (contains only)
        if isinstance(store, RedisBackedStore):  # issue 14B: Redis only when it beats recompute
            store.read_gate = recompute_gate(lambda: self.cost.prefill_tokens_per_s,
                                             tokens_per_chunk, config.kv_read_bytes_per_s_prior)
        geometry = TierGeometry(namespace, tokens_per_chunk, int(rows.shape[1]))
        self.persist = PersistentKV(
            store, geometry, self.cost,
            lambda done: make_executor(config, store, rows, _region_fd(offloading_spec), done,
                                       self.cost.observe_read),
            save=config.enable_kv_save)
        if _on_gpu() and self.persist.io_in_engine_process:
            _shorten_gil_switch_interval()
        attach = getattr(offloading_spec, "attach_tier", None)
        if callable(attach):
            attach(self.persist)
        logger.info("vlmcache KV tier: %d rows of %d bytes, %d tokens per row, store %s",
                    rows.shape[0], rows.shape[1], tokens_per_chunk, config.store_dir)

    def lookup(self, key: Any, req_context: ReqContext) -> LookupResult:
        hit = self.persist.lookup(bytes(key), req_context.req_id)
        return LookupResult.HIT if hit else LookupResult.MISS

    def submit_store(self, job_metadata: Any) -> None:
        ctx = job_metadata.req_context
        self.persist.submit_store(job_metadata.job_id, [bytes(k) for k in job_metadata.keys],
                                  compat.job_rows(job_metadata), ctx.req_id, _tenant(ctx))

    def submit_load(self, job_metadata: Any) -> None:
        self.persist.submit_load(job_metadata.job_id, [bytes(k) for k in job_metadata.keys],
                                 compat.job_rows(job_metadata), job_metadata.req_context.req_id)

    def get_finished_jobs(self) -> Iterable[JobResult]:
        return [compat.job_result(JobResult, o.job_id, o.success, o.nbytes, o.seconds,
                                  list(o.loaded_keys) if o.loaded_keys is not None else None)
                for o in self.persist.finished()]

    def has_pending_work(self) -> bool:
        return self.persist.has_pending()

    def on_new_request(self, req_context: ReqContext) -> RequestOffloadingContext:
        return RequestOffloadingContext()

    def drain_jobs(self) -> None:
        self.persist.drain()

    def shutdown(self) -> None:
        self.persist.shutdown()
