"""Encoder-output tier (L1.5), plain logic: which images to load, what to save, what to report.

An image's encoder output (what the projector hands the language model) is stored under
:func:`~vlmcache.keys.encoder_output_key` of the engine's namespace and vLLM's identifier
for the image. Only outputs of identifiers vlmcache scoped to a tenant are stored: those it
minted (``vlmc-...``, from pixels and tenant: :func:`~vlmcache.keys.image_uuid`, sent by
``CachedLLM`` and the serving front), and those vLLM derived from them (with
``--media-io-kwargs`` or processor kwargs set, vLLM hashes the uuid with them: the front
marks such requests ``scoped_media`` when it minted every medium in them). vLLM's own hash
of a medium's bytes ignores the tenant, so an output stored under it would serve every
tenant: it is never stored. A lookup finds only what was stored, so it needs no such check
(an identifier vLLM hashed from content cannot equal one it hashed from a minted uuid).

A promise the worker cannot keep is an encode, never a dead engine. The scheduler promises
an output (``has``) from the store's index alone: under vLLM's ``mp`` executor the worker
is another process, which reads and verifies the output itself, so a scheduler-side read
(31 MB and its sha256 for a 60-frame clip on Qwen2-VL-7B) would only stall the scheduler's
loop before the worker's own read. The worker's copy may have been evicted, and the file
removed or damaged, since the index said yes. vLLM 0.32 has no
encoder-side ``recompute`` policy (its ``take_unavailable_requests`` fails the request, and
a promised output missing at gather time raises "Encoder cache miss" and kills the
EngineCore). So each load carries the request and input it serves, and a load that fails is
handed back to vLLM's encoder for the same step (:func:`encode_instead`): the connector adds
it to the step's ``scheduled_encoder_inputs``, which the worker's model runner encodes right
after the connector's load (the item's pixels are still in the worker: vLLM strips them only
for inputs its prefix cache covers). The answer is the same, one encode slower.
No vLLM import: :mod:`vlmcache.vllm.ec_connector` translates.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping, Protocol

import torch

from vlmcache.keys import encoder_output_key, is_minted_image_uuid
from vlmcache.vllm.encoder_cost import EncoderGate

logger = logging.getLogger(__name__)

TENSOR_NAME = "encoder_output"


@dataclass(frozen=True)
class EncoderLoad:
    """One encoder output to place in the worker's encoder cache."""

    identifier: str
    key: str
    num_embeds: int
    #: the request and its input index this load serves (where a failed load is encoded)
    request_id: str = ""
    input_id: int = -1


class EncoderStore(Protocol):
    def contains(self, key: str) -> bool: ...

    def get(self, key: str) -> dict[str, torch.Tensor] | None: ...

    def put(self, key: str, tensors: Mapping[str, torch.Tensor], *,
            tenant: str | None = None) -> bool: ...


@dataclass
class _RequestItems:
    loaded: set[str] = field(default_factory=set)
    computed: set[int] = field(default_factory=set)


class EncoderPlanner:
    """Scheduler side: answers "is this image's encoder output stored?" and plans loads."""

    def __init__(self, namespace_digest: str, available: Callable[[str], bool],
                 enabled: bool = True, gate: EncoderGate | None = None) -> None:
        self.namespace_digest = namespace_digest
        self._available = available
        self._enabled = enabled
        self._gate = gate
        self._pending: dict[str, EncoderLoad] = {}
        self._requests: dict[str, _RequestItems] = {}

    def key(self, identifier: str) -> str:
        return encoder_output_key(self.namespace_digest, identifier)

    def has(self, identifier: str) -> bool:
        """Whether the store's index holds the output (``available``: no read, no side
        effect; a promise the worker then fails to keep is encoded instead:
        :func:`encode_instead`), and, with a gate, worth reading rather than encoding."""
        if not self._enabled:
            return False
        key = self.key(identifier)
        if self._gate is not None:
            decision = self._gate.decide(key)
            if decision is not None and decision.choice == "skip":
                return False
        return self._available(key)

    def observe_reads(self, reads: tuple[tuple[int, float], ...]) -> None:
        """The workers' timed reads of stored outputs (bytes, seconds): the gate's rate."""
        if self._gate is not None:
            for nbytes, seconds in reads:
                self._gate.cost.observe_read(nbytes, seconds)

    def on_allocated(self, request_id: str, identifier: str, num_embeds: int,
                     input_id: int = -1) -> None:
        """Input ``input_id`` of a request will be served from the store (if stored)."""
        if not self.has(identifier):
            return
        self._pending[identifier] = EncoderLoad(identifier, self.key(identifier), num_embeds,
                                                request_id, input_id)
        self._requests.setdefault(request_id, _RequestItems()).loaded.add(identifier)

    def on_computed(self, request_id: str, input_ids: list[int]) -> None:
        """The scheduler sent these encoder inputs of a request to the encoder."""
        self._requests.setdefault(request_id, _RequestItems()).computed.update(input_ids)

    def on_encoded_instead(self, request_id: str, identifier: str, input_id: int) -> None:
        """A worker could not load a promised output and encoded it (for the report)."""
        items = self._requests.get(request_id)
        if items is not None:
            items.loaded.discard(identifier)
            items.computed.add(input_id)

    def take_loads(self) -> tuple[EncoderLoad, ...]:
        loads, self._pending = tuple(self._pending.values()), {}
        return loads

    def finish(self, request_id: str, num_items: int) -> dict[str, int]:
        """What the request's images got from this tier (for the ReuseReport)."""
        items = self._requests.pop(request_id, _RequestItems())
        return {"encoder_items": num_items, "encoder_loaded": len(items.loaded),
                "encoder_computed": len(items.computed)}


def encode_instead(failed: list[EncoderLoad], encoder_inputs: dict[str, list[int]]) -> int:
    """Add the inputs of ``failed`` loads to ``encoder_inputs`` (the step's
    ``scheduled_encoder_inputs``: request id -> input indices), so the worker's model runner
    encodes them in this step; the number of inputs that could not be handed back (a load
    without its request: only a caller that never said which input it serves)."""
    orphans = 0
    for item in failed:
        if not item.request_id or item.input_id < 0:
            orphans += 1
            logger.error("encoder output for %s failed to load and names no request input: "
                         "vLLM will miss it", item.identifier)
            continue
        inputs = encoder_inputs.setdefault(item.request_id, [])
        if item.input_id not in inputs:
            inputs.append(item.input_id)
    return orphans


class EncoderTransfer:
    """Worker side: puts stored outputs into vLLM's encoder cache; saves new ones."""

    def __init__(self, store: EncoderStore, namespace_digest: str, device: str) -> None:
        self.store = store
        self.namespace_digest = namespace_digest
        self.device = device
        self.loaded = 0
        self.saved = 0
        self.faults = 0
        self._reads: list[tuple[int, float]] = []

    def take_reads(self) -> tuple[tuple[int, float], ...]:
        """The reads from disk or Redis since the last call, ``(bytes, seconds)`` each, for
        the scheduler's gate (reads from this process's memory say nothing about them)."""
        reads, self._reads = tuple(self._reads), []
        return reads

    def load(self, loads: tuple[EncoderLoad, ...],
             encoder_cache: dict[str, object]) -> list[EncoderLoad]:
        """Put each stored output into ``encoder_cache``; the loads that failed (to be
        encoded instead: :func:`encode_instead`)."""
        failed: list[EncoderLoad] = []
        for item in loads:
            if item.identifier in encoder_cache:
                continue
            chunk = self._read(item.key)
            tensor = chunk.get(TENSOR_NAME) if chunk is not None else None
            if tensor is None or tensor.shape[0] != item.num_embeds:
                # The scheduler's index said yes; this process's copy was evicted and the
                # file removed or damaged since (or it changed shape).
                self.faults += 1
                logger.warning("encoder output for %s vanished or changed shape after the "
                               "scheduler's lookup: encoded instead", item.identifier)
                failed.append(item)
                continue
            encoder_cache[item.identifier] = tensor.to(self.device)
            self.loaded += 1
        return failed

    def _read(self, key: str) -> dict[str, torch.Tensor] | None:
        """The stored output (read and verified), timed when it was not in memory."""
        locate = getattr(self.store, "locate", None)
        try:
            where = locate(key) if locate is not None else None
            started = time.perf_counter()
            chunk = self.store.get(key)
        except Exception:  # a cache fault is an encode, never a crash
            logger.debug("reading encoder output %s failed", key[:16], exc_info=True)
            return None
        if chunk is not None and where is not None and where[0] != "memory":
            self._reads.append((where[1], time.perf_counter() - started))
        return chunk

    def save(self, encoder_cache: Mapping[str, object], identifier: str,
             tenant: str | None = None, scoped: bool = False) -> None:
        """Persist the output of a tenant-scoped identity (minted by vlmcache, or
        ``scoped``: derived by vLLM from minted ones), charged to ``tenant``."""
        if not (scoped or is_minted_image_uuid(identifier)):
            return  # not tenant-scoped (vLLM's own hash, or a client's): never persisted
        output = encoder_cache.get(identifier)
        if not isinstance(output, torch.Tensor):
            logger.debug("encoder output for %s is not one tensor; not stored", identifier)
            return
        key = encoder_output_key(self.namespace_digest, identifier)
        if self.store.contains(key):
            return
        if self.store.put(key, {TENSOR_NAME: output.detach().to("cpu").contiguous()},
                          tenant=tenant):
            self.saved += 1
