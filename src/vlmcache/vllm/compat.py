"""Differences between the vLLM versions vlmcache supports (0.26 on GPUs to 0.32 on CPUs).

Every version check lives here; the connectors and the persistent tier call these functions
instead of branching.
"""

from __future__ import annotations

import inspect
import logging
import os
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


def ec_transfer_costs_runner(device_type: str) -> bool:
    """Whether wiring vLLM's EC transfer (the encoder-output tier) moves this engine off its
    default model runner. vLLM 0.26 runs its V2 model runner by default on GPUs, and V2 does
    not take EC transfer there (vLLM lists it as unsupported): with it the whole engine
    falls back to V1 (the fifth H200 lease's logs: plain "Using V2 Model Runner", ours "Model
    Runner V2 does not yet support EC transfer"). 0.32 takes it. An operator who chose V1
    (``VLLM_USE_V2_MODEL_RUNNER=0``) loses nothing; one who forced V2 would fail to start."""
    if device_type != "cuda":
        return False
    if os.environ.get("VLLM_USE_V2_MODEL_RUNNER", "").strip() == "0":
        return False
    try:
        from vllm.config import VllmConfig

        probe = VllmConfig._get_v2_model_runner_unsupported_features
    except (ImportError, AttributeError):
        return False  # no V2 model runner in this vLLM
    try:  # the feature list is code, not data: read it (0.26: "EC transfer" is in it)
        return "EC transfer" in inspect.getsource(probe)
    except (OSError, TypeError):
        return True  # cannot tell: as in the version measured


def null_media_kinds() -> tuple[str, ...]:
    """The media parts (``image_url``, ``video_url``) this vLLM's server takes by identity
    alone (the part's data ``None``, its ``uuid`` naming an item in the processor cache).
    0.32 parses both; 0.26 parses a null image but asserts on a null video, a 500 where a
    missing item would be a 400 (the seventh H200 lease's Qwen2-VL follow-up). Both when
    vLLM cannot be asked: the front then learns it from the engine's answers."""
    try:
        from vllm.multimodal.parse import MultiModalDataParser

        parser = MultiModalDataParser()
    except Exception:  # not importable here, or another constructor: cannot tell
        return ("image_url", "video_url")
    kinds = []
    for kind, parse in (("image_url", parser._parse_image_data),
                        ("video_url", parser._parse_video_data)):
        try:
            parse([None])
        except Exception:  # 0.26's video parser: assert_never(None)
            continue
        kinds.append(kind)
    return tuple(kinds)


# ---- vLLM's KV offloading API (vllm.v1.kv_offload): 0.26 -> 0.32 ---------------------------


def job_rows(job: Any) -> list[int]:
    """Primary-tier rows of a tiering job (0.26 ``JobMetadata.block_ids``, 0.32
    ``TransferJob.chunk_ids``)."""
    rows = getattr(job, "chunk_ids", None)
    if rows is None:
        rows = job.block_ids
    return [int(r) for r in rows]


def job_result(result_cls: type, job_id: int, success: bool, nbytes: int, seconds: float,
               successful_keys: Any = None) -> Any:
    """A tiering ``JobResult``; 0.32 also takes the transfer's bytes and time and, for a
    partly failed load, the keys that did load (0.26: the whole job fails)."""
    try:
        return result_cls(job_id=job_id, success=success, transfer_time=seconds,
                          transfer_bytes=nbytes, successful_keys=successful_keys)
    except TypeError:
        return result_cls(job_id=job_id, success=success)


def tier_base_kwargs(backpressure_detector: Any) -> dict[str, Any]:
    """Extra ``SecondaryTierManager.__init__`` arguments (0.32 added back-pressure)."""
    return {} if vllm_version() < (0, 30) else {"backpressure_detector": backpressure_detector}


def offload_rows(spec: Any) -> int:
    """Rows of the CPU primary tier (0.26 ``num_blocks``, 0.32 ``num_chunks``)."""
    rows = getattr(spec, "num_chunks", None)
    return int(rows if rows is not None else spec.num_blocks)


def delegate(wrapper: object, inner: object, name: str) -> Any:
    """``inner.name`` for a wrapper's ``__getattr__``; a method is bound onto the wrapper
    once, so vLLM's per-step and per-block manager calls skip this lookup afterwards."""
    value = getattr(inner, name)
    if callable(value):
        wrapper.__dict__[name] = value
    return value


class FinishedRequestGuard:
    """vLLM's tiering ``OffloadingManager`` with stores for a finished request refused
    instead of crashing the EngineCore.

    Before vllm-project/vllm#49671 (so in 0.26), the offloading scheduler tells the manager
    a request finished before it prepares that request's last store; the manager has then
    dropped the request's state and ``prepare_store`` raises ``KeyError``, which kills the
    engine (measured: vLLM's own tiering spec died this way on a LLaVA-1.5-7B batch, twice).
    A refused store is a miss: vLLM logs "cannot store chunks" and the blocks are computed
    again if asked for. From 0.32 on the scheduler never asks, and this passes through.
    """

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.refused = 0

    def prepare_store(self, keys: Any, req_context: Any) -> Any:
        states = getattr(self._inner, "_req_state", None)
        if states is not None and req_context.req_id not in states:
            self.refused += 1
            if self.refused == 1:  # once: the cause is vLLM's, and it repeats
                logger.warning("vlmcache KV tier: vLLM asked to store blocks of finished "
                               "request %s (a vLLM <= 0.26 ordering bug, vllm#49635); "
                               "not stored", req_context.req_id)
            return None
        return self._inner.prepare_store(keys, req_context)

    def __getattr__(self, name: str) -> Any:
        return delegate(self, self._inner, name)


def clamp_finished_stores(scheduler: Any, scheduler_output: Any) -> int:
    """Keep vLLM 0.26's offloading scheduler from storing chunks a finished request has no
    GPU blocks for; the number of requests clamped.

    0.26's ``_build_store_jobs`` takes a finished request's chunks up to ``num_tokens``; a
    request preempted (its ``block_ids`` cleared) and then aborted while it waited (a client
    that gave up under overload) has offload keys past its blocks, and the assertion
    ``len(offload_keys) == len(offload_block_ids)`` kills the EngineCore (measured: Qwen2-VL
    at 120 req/s on an H200, through this connector). 0.32 counts an aborted request's
    computed tokens only. Here the offload keys of each finished request are cut to the
    chunks its blocks cover (never below what was stored): there is nothing else to store.
    A no-op where the scheduler's state has other names, and for requests whose blocks are
    all there."""
    states = getattr(scheduler, "_req_status", None)
    per_chunk = getattr(getattr(scheduler, "config", None), "blocks_per_chunk", None)
    if not isinstance(states, dict) or not per_chunk:
        return 0
    clamped = 0
    for req_id in getattr(scheduler_output, "finished_req_ids", None) or ():
        status = states.get(req_id)
        for group in getattr(status, "group_states", ()) if status is not None else ():
            keys, blocks = group.offload_keys, group.block_ids
            keep = max(len(blocks) // per_chunk, group.next_stored_chunk_idx)
            if len(keys) > keep:
                del keys[keep:]
                clamped += 1
    return clamped


# ---- the GPU KV cache's memory layout: 0.26 (cross-layer blocks) -> 0.32 (per layer) ------


def cross_layer_blocks_possible() -> bool:
    """Whether vLLM can lay one block's KV of all layers out together (0.26 does for
    offloading connectors; 0.32 keeps a tensor per layer)."""
    return vllm_version() < (0, 30)


def kv_memory_layout(block_layout: str, required_order: str | None) -> str:
    """What a KV block's bytes look like in this engine: per layer or across layers, and
    the dimension order (``VLLM_KV_CACHE_LAYOUT`` wins over what the connector asks for;
    neither: the attention backends' ``NHD``). Part of every persisted KV key: bytes laid
    out one way must never load into an engine laid out another."""
    import os

    order = os.environ.get("VLLM_KV_CACHE_LAYOUT") or required_order or "NHD"
    blocks = block_layout if cross_layer_blocks_possible() else "per_layer"
    return f"blocks={blocks};order={order}"
