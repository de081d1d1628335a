"""vLLM KV connector: persists prompt KV blocks and loads them back, across processes.

Enable it with::

    vllm serve MODEL --block-size 32 --kv-transfer-config '{"kv_connector": "VlmCacheConnector",
      "kv_connector_module_path": "vlmcache.vllm.connector", "kv_role": "kv_both",
      "kv_load_failure_policy": "recompute",
      "kv_connector_extra_config": {"store_path": "/var/cache/vlmcache"}}'

This class only translates between vLLM's objects and :class:`~vlmcache.vllm.plan.KVPlanner`
(scheduler side) and :class:`~vlmcache.vllm.transfer.KVTransfer` (worker side).
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
)

from vlmcache.config import VlmCacheConfig
from vlmcache.keys import MultiModalSpan
from vlmcache.store.kvstore import shared_kv_store
from vlmcache.vllm import compat
from vlmcache.vllm.namespace import namespace_for_engine
from vlmcache.vllm.plan import KVPlanner, RequestView, StepPlan
from vlmcache.vllm.transfer import KVTransfer, PagedKV

if TYPE_CHECKING:
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)

PARAMS_KEY = "vlmcache"


@dataclass
class VlmCacheMetadata(KVConnectorMetadata):
    """One step's plan, sent from the scheduler to the workers."""

    plan: StepPlan


def request_view(request: "Request") -> RequestView:
    """The planner's view of a vLLM request."""
    spans = tuple(
        MultiModalSpan(f.identifier, f.mm_position.offset, f.mm_position.length)
        for f in (request.mm_features or [])
    )
    params = request.kv_transfer_params or {}
    ours = params.get(PARAMS_KEY) if isinstance(params, dict) else None
    bypass = bool(ours.get("bypass")) if isinstance(ours, dict) else False
    return RequestView(request_id=request.request_id,
                       prompt_token_ids=request.prompt_token_ids or [],
                       spans=spans, tenant=getattr(request, "cache_salt", None),
                       bypass=bypass)


#: GIL hand-over interval (s) in a GPU engine process running vlmcache's background threads.
GIL_SWITCH_INTERVAL_S = 0.0005


def _shorten_gil_switch_interval() -> None:
    """The store's background threads (async saves, disk write-behind) run Python between
    their copies; with the default 5 ms interval the engine's step loop, which gives the
    GIL up at every CUDA sync, waits up to 5 ms each time to get it back (the convoy
    effect), which showed as +15-50 ms per request on an H200. A short interval bounds it."""
    if sys.getswitchinterval() > GIL_SWITCH_INTERVAL_S:
        logger.info("vlmcache: GIL switch interval %.1f ms -> %.1f ms",
                    sys.getswitchinterval() * 1e3, GIL_SWITCH_INTERVAL_S * 1e3)
        sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


class VlmCacheConnector(KVConnectorBase_V1):
    """The vlmcache KV connector (``kv_role="kv_both"``)."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole,
                 kv_cache_config: Any = None) -> None:
        compat.init_connector_base(self, KVConnectorBase_V1, vllm_config, role,
                                   kv_cache_config)
        compat.check_supported()
        transfer_config = vllm_config.kv_transfer_config
        self._config = VlmCacheConfig.from_extra_config(
            transfer_config.kv_connector_extra_config)
        self._kv_cache_config = kv_cache_config
        self._store = shared_kv_store(self._config)
        self._planner: KVPlanner | None = None
        self._transfer: KVTransfer | None = None
        self._failed_block_ids: set[int] = set()
        if role == KVConnectorRole.SCHEDULER:
            namespace = namespace_for_engine(vllm_config, self._config)
            policy = getattr(transfer_config, "kv_load_failure_policy", "recompute")
            if policy != "recompute":
                logger.warning("kv_load_failure_policy=%r: a corrupt cached block fails its "
                               "request; set it to 'recompute' to recompute instead", policy)
            self._planner = KVPlanner(
                namespace.digest, vllm_config.cache_config.block_size, self._store.contains,
                self._store.ensure_in_memory,
                load_enabled=self._config.enable_kv_load,
                save_enabled=self._config.enable_kv_save,
                min_load_tokens=self._config.min_load_tokens)
            logger.info("vlmcache KV connector: store %s, namespace %s",
                        self._config.store_dir, namespace.describe())

    # ---- worker side -------------------------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, Any]) -> None:
        num_blocks = compat.num_kv_blocks(self._kv_cache_config, kv_caches)
        # pinned host memory for the memory tier, allocated once (a GPU only)
        paged = PagedKV(kv_caches, num_blocks, compat.block_dim_hint(),
                        pinned_bytes=self._config.memory_budget)
        self._transfer = KVTransfer(paged, self._store)
        if paged.on_gpu:
            _shorten_gil_switch_interval()
        logger.info("vlmcache: %d KV layers, %d blocks, %d bytes per block",
                    len(paged.layers), num_blocks, paged.bytes_per_block())

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        plan = self._step_plan()
        if plan is None or not plan.loads:
            return
        if self._transfer is None:
            self._failed_block_ids.update(b for t in plan.loads for b in t.block_ids)
            return
        self._failed_block_ids.update(self._transfer.load(plan.loads))

    def wait_for_layer_load(self, layer_name: str) -> None:
        return

    def save_kv_layer(self, layer_name: str, kv_layer: Any, attn_metadata: Any,
                      **kwargs: Any) -> None:
        return  # blocks are saved whole, after the forward pass, in wait_for_save

    def wait_for_save(self) -> None:
        plan = self._step_plan()
        if plan is None or not plan.saves or self._transfer is None:
            return
        self._transfer.save(plan.saves)
        if self._config.disk_write == "sync":
            self._transfer.flush()
            self._store.flush()

    def get_block_ids_with_load_errors(self) -> set[int]:
        failed, self._failed_block_ids = self._failed_block_ids, set()
        return failed

    def shutdown(self) -> None:
        if self._transfer is not None:
            self._transfer.flush()
        self._store.flush()

    def _step_plan(self) -> StepPlan | None:
        if not self.has_connector_metadata():
            return None
        meta = self._get_connector_metadata()
        return meta.plan if isinstance(meta, VlmCacheMetadata) else None

    # ---- scheduler side ----------------------------------------------------------------

    def get_num_new_matched_tokens(self, request: "Request",
                                   num_computed_tokens: int) -> tuple[int, bool]:
        assert self._planner is not None
        return self._planner.lookup(request_view(request), num_computed_tokens), False

    def update_state_after_alloc(self, request: "Request", blocks: Any,
                                 num_external_tokens: int) -> None:
        assert self._planner is not None
        self._planner.on_allocated(request_view(request), num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        assert self._planner is not None
        loads, saves = [], []
        scheduled = scheduler_output.num_scheduled_tokens
        for new in scheduler_output.scheduled_new_reqs:
            step = self._planner.on_scheduled(new.req_id, new.block_ids[0], True,
                                              new.num_computed_tokens,
                                              scheduled.get(new.req_id, 0))
            loads.extend(step.loads)
            saves.extend(step.saves)
        cached = scheduler_output.scheduled_cached_reqs
        for i in range(len(cached.req_ids)):
            req_id, block_ids, replaced, computed = compat.cached_req_fields(cached, i)
            step = self._planner.on_scheduled(req_id, block_ids, replaced, computed,
                                              scheduled.get(req_id, 0))
            loads.extend(step.loads)
            saves.extend(step.saves)
        return VlmCacheMetadata(plan=StepPlan(loads=tuple(loads), saves=tuple(saves)))

    def update_connector_output(self, connector_output: Any) -> None:
        failed = getattr(connector_output, "invalid_block_ids", None)
        if failed and self._planner is not None:
            self._planner.on_load_errors(set(failed))

    def request_finished(self, request: "Request",
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        assert self._planner is not None
        reuse = self._planner.finish(request.request_id)
        return False, ({PARAMS_KEY: reuse.to_params()} if reuse is not None else None)
