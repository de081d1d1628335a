"""vLLM encoder-cache connector: persists vision-encoder outputs (L1.5) across processes.

Enable it beside the KV connector::

    vllm serve MODEL --ec-transfer-config '{"ec_connector": "VlmCacheECConnector",
      "ec_connector_module_path": "vlmcache.vllm.ec_connector", "ec_role": "ec_both",
      "ec_buffer_device": "cuda", "ec_connector_extra_config": {"store_path": "..."}}'

Translation only; the logic is in :mod:`vlmcache.vllm.encoder_plan`.

A load the worker cannot deliver is encoded in the same step (see
:mod:`vlmcache.vllm.encoder_plan`): the metadata carries the step's
``scheduled_encoder_inputs`` dict itself, which vLLM's pickling keeps one object with the
``SchedulerOutput`` field the worker's model runner encodes from after our load. With tensor
parallelism every rank must run the same encoder batch, so the ranks first agree on which
loads failed (an all-reduce over the TP group, only in steps that load).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vllm.distributed.ec_transfer.ec_connector.base import (
    ECConnectorBase,
    ECConnectorMetadata,
    ECConnectorRole,
)

try:  # vLLM 0.32; without it (0.26) the worker has no channel back and the report says loaded
    from vllm.distributed.ec_transfer.ec_connector.base import ECConnectorWorkerMetadata
except ImportError:  # pragma: no cover - the CPU test machine runs 0.32
    ECConnectorWorkerMetadata = object  # type: ignore[misc,assignment]

from vlmcache.config import VlmCacheConfig
from vlmcache.store.kvstore import shared_encoder_store
from vlmcache.vllm.cost import CostModel, CostPriors
from vlmcache.vllm.encoder_cost import EncoderGate
from vlmcache.vllm.encoder_plan import (
    EncoderLoad, EncoderPlanner, EncoderTransfer, encode_instead,
)
from vlmcache.vllm.logs import attach_to_vllm_logging
from vlmcache.vllm.namespace import namespace_for_engine

if TYPE_CHECKING:
    from vllm.v1.request import Request

logger = logging.getLogger(__name__)

PARAMS_KEY = "vlmcache"


@dataclass
class VlmCacheECMetadata(ECConnectorMetadata):
    """Encoder outputs the workers load this step, and the tenant of each image identity
    allocated this step (so a saved output is charged to the tenant that asked)."""

    loads: tuple[EncoderLoad, ...]
    tenants: tuple[tuple[str, str], ...] = ()
    #: identifiers vLLM derived from identities vlmcache minted (storable: tenant-scoped)
    scoped: tuple[str, ...] = ()
    #: the step's ``scheduled_encoder_inputs`` (the same object): where failed loads go
    encode_inputs: dict[str, list[int]] = field(default_factory=dict)


def request_scoped_media(request: Any) -> bool:
    """Whether the serving front minted every medium of the request (so each identifier
    vLLM derives for it is tenant-scoped, whatever kwargs vLLM hashed in)."""
    params = getattr(request, "kv_transfer_params", None) or {}
    ours = params.get(PARAMS_KEY) if isinstance(params, dict) else None
    return isinstance(ours, dict) and ours.get("scoped_media") is True


def request_tenant(request: Any) -> str | None:
    """The tenant the serving front put in the request's ``kv_transfer_params``."""
    params = getattr(request, "kv_transfer_params", None) or {}
    ours = params.get(PARAMS_KEY) if isinstance(params, dict) else None
    tenant = ours.get("tenant") if isinstance(ours, dict) else None
    return tenant if isinstance(tenant, str) else None


@dataclass
class VlmCacheECWorkerMeta(ECConnectorWorkerMetadata):
    """Worker -> scheduler: the loads this step encoded instead, ``(request, identifier,
    input)`` each (so the request's report counts them as encoded, not loaded), and the
    worker's timed reads from disk or Redis, ``(bytes, seconds)`` (the gate's read rate)."""

    encoded_instead: tuple[tuple[str, str, int], ...] = ()
    reads: tuple[tuple[int, float], ...] = ()

    def aggregate(self, other: Any) -> "VlmCacheECWorkerMeta":
        if not isinstance(other, VlmCacheECWorkerMeta):
            return self
        return VlmCacheECWorkerMeta(
            tuple(dict.fromkeys(self.encoded_instead + other.encoded_instead)),
            self.reads + other.reads)


class VlmCacheECConnector(ECConnectorBase):
    """The vlmcache encoder-cache connector (``ec_role="ec_both"``)."""

    def __init__(self, vllm_config: Any, role: ECConnectorRole) -> None:
        super().__init__(vllm_config=vllm_config, role=role)
        attach_to_vllm_logging()  # this runs in vLLM's engine processes
        extra = vllm_config.ec_transfer_config.ec_connector_extra_config
        self._config = VlmCacheConfig.from_extra_config(extra)
        namespace = namespace_for_engine(vllm_config, self._config, encoder=True)
        self._store = shared_encoder_store(self._config)
        self._planner = EncoderPlanner(namespace.digest, self._store.contains,
                                       self._config.enable_encoder_cache,
                                       _gate(self._config, self._store, vllm_config))
        device = vllm_config.ec_transfer_config.ec_buffer_device or "cpu"
        self._transfer = EncoderTransfer(self._store, namespace.digest, device)
        self._step_tenants: dict[str, str] = {}
        self._step_scoped: set[str] = set()
        self._encoded_instead: list[tuple[str, str, int]] = []

    # ---- worker side -------------------------------------------------------------------

    def start_load_caches(self, encoder_cache: dict[str, Any], **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if isinstance(meta, VlmCacheECMetadata) and meta.loads:
            failed = _agree_across_ranks(meta.loads,
                                         self._transfer.load(meta.loads, encoder_cache))
            if failed:  # a fault is an encode in this step, never "Encoder cache miss"
                encode_instead(failed, meta.encode_inputs)
                self._encoded_instead += [(f.request_id, f.identifier, f.input_id)
                                          for f in failed]

    def build_connector_worker_meta(self) -> Any:
        reads = self._transfer.take_reads()
        if not self._encoded_instead and not reads:
            return None
        done, self._encoded_instead = tuple(self._encoded_instead), []
        return VlmCacheECWorkerMeta(done, reads)

    def save_caches(self, encoder_cache: dict[str, Any], mm_hash: str, **kwargs: Any) -> None:
        if self._config.enable_encoder_cache:
            meta = getattr(self, "_connector_metadata", None)  # bound for this step
            ours = isinstance(meta, VlmCacheECMetadata)
            tenants = dict(meta.tenants) if ours else {}
            self._transfer.save(encoder_cache, mm_hash, tenants.get(mm_hash),
                                scoped=ours and mm_hash in meta.scoped)

    def shutdown(self) -> None:
        self._store.flush()

    # ---- scheduler side ----------------------------------------------------------------

    def has_cache_item(self, identifier: str) -> bool:
        return self._planner.has(identifier)

    def update_state_after_alloc(self, request: "Request", index: int) -> None:
        feature = request.mm_features[index]
        tenant = request_tenant(request)
        if tenant is not None:
            self._step_tenants[feature.identifier] = tenant
        if request_scoped_media(request):
            self._step_scoped.add(feature.identifier)
        self._planner.on_allocated(request.request_id, feature.identifier,
                                   request.get_num_encoder_embeds(index), index)

    def build_connector_meta(self, scheduler_output: Any) -> ECConnectorMetadata:
        computed = getattr(scheduler_output, "scheduled_encoder_inputs", None)
        if computed is None:
            computed = {}
        for request_id, input_ids in computed.items():
            self._planner.on_computed(request_id, list(input_ids))
        tenants, self._step_tenants = tuple(self._step_tenants.items()), {}
        scoped, self._step_scoped = tuple(sorted(self._step_scoped)), set()
        return VlmCacheECMetadata(loads=self._planner.take_loads(), tenants=tenants,
                                  scoped=scoped, encode_inputs=computed)

    def update_connector_output(self, connector_output: Any) -> None:
        meta = getattr(connector_output, "ec_connector_worker_meta", None)
        if isinstance(meta, VlmCacheECWorkerMeta):
            for request_id, identifier, input_id in meta.encoded_instead:
                self._planner.on_encoded_instead(request_id, identifier, input_id)
            self._planner.observe_reads(meta.reads)

    def request_finished(self, request: "Request") -> tuple[bool, dict[str, Any] | None]:
        items = self._planner.finish(request.request_id, len(request.mm_features or []))
        return False, {PARAMS_KEY: items}


def _gate(config: VlmCacheConfig, store: Any, vllm_config: Any) -> EncoderGate | None:
    """The load-versus-encode gate (``None``: a store that cannot say where a key is, or a
    model whose output size per embed is unknown; then every stored output is loaded)."""
    locate = getattr(store, "locate", None)
    try:
        model = vllm_config.model_config
        import torch

        per_embed = int(model.get_hidden_size()) * torch.empty(
            (), dtype=model.dtype).element_size()
    except Exception:  # a config without a text hidden size: no decision to make
        return None
    if locate is None or per_embed <= 0:
        return None
    cost = CostModel(CostPriors(read_bytes_per_s=config.kv_read_bytes_per_s_prior,
                                read_fixed_s=config.kv_read_fixed_s,
                                prefill_tokens_per_s=config.encoder_embeds_per_s_prior),
                     enabled=config.kv_cost_model)
    return EncoderGate(cost, locate, per_embed)


def _agree_across_ranks(loads: tuple[EncoderLoad, ...],
                        failed: list[EncoderLoad]) -> list[EncoderLoad]:
    """The loads that failed on any rank of the tensor-parallel group (every rank must
    encode the same inputs: the vision tower's collectives would hang otherwise)."""
    try:
        import torch
        import torch.distributed as dist
        from vllm.distributed.parallel_state import get_tp_group

        group = get_tp_group()
    except (ImportError, AssertionError, AttributeError):  # no TP group: one rank
        return failed
    if group.world_size <= 1:
        return failed
    mine = {id(item) for item in failed}
    flags = torch.tensor([int(id(item) in mine) for item in loads], dtype=torch.int32)
    dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=group.cpu_group)
    return [item for item, flag in zip(loads, flags.tolist()) if flag]
