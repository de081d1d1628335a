"""vlmcache's KV connector: vLLM's ``OffloadingConnector`` plus vlmcache's report and cost model.

vLLM moves the KV (GPU <-> CPU region with its tuned DMA path; CPU region <-> vlmcache's
persistent tier through :mod:`vlmcache.vllm.offload_tier`). This subclass only adds:

* the namespace digest every persisted key is bound to (computed from the engine's config
  before vLLM builds the spec);
* the engine's prefill rate, timed from consecutive scheduler steps, for the cost model;
* the per-request ``kv_transfer_params["vlmcache"]`` that ``report.KVReuse`` reads.

Enable it with (``engine_wiring`` builds the full value)::

    vllm serve MODEL --kv-transfer-config '{"kv_connector": "VlmCacheOffloadingConnector",
      "kv_connector_module_path": "vlmcache.vllm.offload_connector", "kv_role": "kv_both",
      "kv_load_failure_policy": "recompute", "kv_connector_extra_config": {...}}'
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.distributed.kv_transfer.kv_connector.v1.offloading_connector import (
    OffloadingConnector,
)

from vlmcache.keys import KVRowKeys
from vlmcache.vllm import compat
from vlmcache.vllm.logs import attach_to_vllm_logging
from vlmcache.vllm.namespace import namespace_for_engine
from vlmcache.vllm.offload_spec import (
    NAMESPACE_KEY,
    SchedulerRuntime,
    release_runtime,
    runtime_for,
    vlmcache_config,
)
from vlmcache.vllm.persist import TierRequestReport

logger = logging.getLogger(__name__)

PARAMS_KEY = "vlmcache"
#: A gap between two scheduler steps longer than this is idle time, not compute.
MAX_STEP_GAP_S = 5.0


@dataclass
class _RequestTrack:
    prompt_tokens: int
    from_prefix_cache: int = 0
    loaded: int = 0
    bypass: bool = False
    #: vLLM's offload keys of the prompt's full chunks, computed once per request (the
    #: scheduler's step loop pays for every hash: a CPU hit waits on it)
    offload_keys: list[bytes] | None = None


def _wants_bypass(request: Any) -> bool:
    params = getattr(request, "kv_transfer_params", None) or {}
    ours = params.get(PARAMS_KEY) if isinstance(params, dict) else None
    return bool(ours.get("bypass")) if isinstance(ours, dict) else False


class VlmCacheOffloadingConnector(OffloadingConnector):
    """``OffloadingConnector`` with vlmcache's namespace, cost model and per-request report."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole,
                 kv_cache_config: Any = None) -> None:
        compat.check_supported()
        attach_to_vllm_logging()  # this runs in vLLM's engine processes
        transfer = vllm_config.kv_transfer_config
        extra = transfer.kv_connector_extra_config
        config = vlmcache_config(extra)
        self._engine_id = str(transfer.engine_id)
        self._load_enabled = config.enable_kv_load
        # only second-sight admission reads which chunks a request found on the GPU
        self._note_resident = config.admission_memory == "second_sight"
        self._runtime: SchedulerRuntime | None = None
        self._cross_layer = config.kv_block_layout == "cross_layer"
        if role == KVConnectorRole.SCHEDULER:
            memory = compat.kv_memory_layout(config.kv_block_layout,
                                             self.get_required_kvcache_layout(vllm_config))
            namespace = namespace_for_engine(vllm_config, config, kv_memory=memory)
            extra[NAMESPACE_KEY] = namespace.digest  # read by the spec, in this process
            self._runtime = runtime_for(self._engine_id, config)
            self._runtime.namespace_digest = namespace.digest
            if getattr(transfer, "kv_load_failure_policy", "recompute") != "recompute":
                logger.warning("kv_load_failure_policy is not 'recompute': a corrupt cached "
                               "chunk fails its request instead of being recomputed")
            logger.info("vlmcache KV path on vLLM's offloading connector: store %s, "
                        "namespace %s", config.store_dir, namespace.describe())
        super().__init__(vllm_config, role, kv_cache_config)
        self._tracks: dict[str, _RequestTrack] = {}
        self._last_step: tuple[float, int, frozenset[str]] | None = None

    # ---- the GPU KV cache's layout (read by vLLM when it allocates the cache) ---------------

    @property
    def prefer_cross_layer_blocks(self) -> bool:
        return self._cross_layer

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: Any) -> str | None:
        """vLLM's offloading connector's layout, or with ``kv_block_layout: per_layer`` on a
        vLLM that would lay blocks out across layers, none: the attention backend's own."""
        transfer = vllm_config.kv_transfer_config
        extra = getattr(transfer, "kv_connector_extra_config", None) or {}
        if (compat.cross_layer_blocks_possible()
                and vlmcache_config(extra).kv_block_layout == "per_layer"):
            return None
        return super().get_required_kvcache_layout(vllm_config)

    # ---- scheduler side: observe, then delegate ---------------------------------------------

    def get_num_new_matched_tokens(self, request: Any,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        track = self._tracks.get(request.request_id)
        if track is None:
            track = self._tracks[request.request_id] = _RequestTrack(
                len(request.prompt_token_ids or []), num_computed_tokens,
                bypass=_wants_bypass(request))
            self._first_sight(request, track, num_computed_tokens)
        matched, is_async = super().get_num_new_matched_tokens(request, num_computed_tokens)
        if matched and (track.bypass or not self._load_enabled):
            return 0, False
        return matched, is_async

    def update_state_after_alloc(self, request: Any, blocks: Any,
                                 num_external_tokens: int) -> None:
        track = self._tracks.get(request.request_id)
        if track is not None and num_external_tokens:
            track.loaded = num_external_tokens
        return super().update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: Any) -> Any:
        self._time_step(scheduler_output)
        if compat.clamp_finished_stores(getattr(self, "connector_scheduler", None),
                                        scheduler_output):
            logger.info("vlmcache KV: stores of finished requests cut to their GPU blocks "
                        "(preempted, then aborted: a vLLM 0.26 offloading bug)")
        return super().build_connector_meta(scheduler_output)

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, dict | None]:
        delay, params = super().request_finished(request, block_ids)
        return delay, self._with_report(request, params)

    def request_finished_all_groups(self, request: Any,
                                    block_ids: Any) -> tuple[bool, dict | None]:
        delay, params = super().request_finished_all_groups(request, block_ids)
        return delay, self._with_report(request, params)

    def shutdown(self) -> None:
        try:
            super().shutdown()
        finally:
            if self._runtime is not None:
                release_runtime(self._engine_id)

    # ---- helpers ------------------------------------------------------------------------------

    def _time_step(self, scheduler_output: Any) -> None:
        """Feed the cost model the previous step's prefill rate: the gap between two
        scheduling calls of a continuously busy engine is one step's compute."""
        now = time.perf_counter()
        running = frozenset(scheduler_output.num_scheduled_tokens)
        last, self._last_step = self._last_step, (
            now, int(scheduler_output.total_num_scheduled_tokens), running)
        if last is None or self._runtime is None:
            return
        start, tokens, prev_running = last
        if running & prev_running and now - start < MAX_STEP_GAP_S:
            self._runtime.cost.observe_prefill(tokens, now - start)

    def _offload_keys(self, request: Any, track: _RequestTrack) -> list[bytes]:
        """vLLM's offload keys of the request's full prompt chunks: chunk ``i``'s key is its
        last block hash (as vLLM's offloading scheduler computes them)."""
        if track.offload_keys is not None:
            return track.offload_keys
        rt = self._runtime
        if rt is None or not rt.tokens_per_chunk or not rt.hashes_per_chunk:
            return []
        from vllm.v1.kv_offload.base import make_offload_key

        hashes = getattr(request, "block_hashes", None) or []
        n_chunks = track.prompt_tokens // rt.tokens_per_chunk
        picked = hashes[rt.hashes_per_chunk - 1::rt.hashes_per_chunk][:n_chunks]
        keys = [bytes(make_offload_key(h, 0)) for h in picked]
        if len(keys) == n_chunks:  # all of them hashed: they cannot change
            track.offload_keys = keys
        return keys

    def _row_keys(self, request: Any, track: _RequestTrack) -> dict[str, str]:
        """The request's full prompt chunks, as the caller derives their store keys (what
        the persistent tier holds or will hold for it): hashing them here would put 41
        SHA-256s of a 665-token prompt on the step loop, for every request."""
        rt = self._runtime
        if rt is None or not rt.namespace_digest:
            return {}
        return KVRowKeys.pack(rt.namespace_digest, self._offload_keys(request, track)).to_params()

    def _first_sight(self, request: Any, track: _RequestTrack, num_computed_tokens: int) -> None:
        """Once per request, on its chunks' keys: record those vLLM's GPU prefix cache holds
        (vLLM offers them for storing too, and second-sight admission must not take a GPU
        hit for a computation), and hand each persistent tier the chunks beyond them, so it
        decides load-or-skip once for its stored prefix (a per-prefix cost, not a per-chunk
        one) if vLLM asks it for one of them."""
        rt = self._runtime
        if rt is None:
            return
        first = num_computed_tokens // max(1, rt.tokens_per_chunk)
        plan = bool(rt.tiers) and not track.bypass and self._load_enabled
        resident = bool(first) and self._note_resident
        if not resident and not plan:
            return
        keys = self._offload_keys(request, track)
        if resident and keys:
            rt.gpu_resident[request.request_id] = frozenset(keys[:first])
        if plan and keys[first:]:
            for tier in rt.tiers:
                tier.expect(request.request_id, keys[first:])

    def _tier_report(self, req_id: str) -> TierRequestReport | None:
        if self._runtime is None:
            return None
        for tier in self._runtime.tiers:
            report = tier.ledger.pop(req_id)
            if report is not None:
                return report
        return None

    def _with_report(self, request: Any, params: dict | None) -> dict | None:
        if self._runtime is not None:
            # its chunks were offered for storing when it was scheduled (vLLM's offloading
            # scheduler stores up to the tokens computed after each step)
            self._runtime.gpu_resident.pop(request.request_id, None)
        track = self._tracks.pop(request.request_id, None)
        if track is None:
            return params
        ours: dict[str, Any] = {
            "prompt_tokens": track.prompt_tokens, "tokens_loaded": track.loaded,
            "tokens_from_prefix_cache": track.from_prefix_cache, "blocks_saved": 0,
            "load_failed_blocks": 0, "bypass": track.bypass,
            **self._row_keys(request, track)}
        tier = self._tier_report(request.request_id)
        if tier is not None:
            ours.update(tier.to_params())
            ours["load_failed_blocks"] = tier.chunks_failed
            ours["blocks_saved"] = tier.stored_chunks
            # where the persistent tier was asked for rows (vLLM's CPU tier had not got them)
            if tier.decision is not None and (tier.chunks_found or tier.chunks_skipped):
                logger.info("vlmcache KV: request %s: %s", request.request_id,
                            tier.decision.reason)
        return {**(params or {}), PARAMS_KEY: ours}
