"""Scheduler-side KV planning: what to load and what to save, per engine step.

Plain Python, no vLLM import: the connector translates vLLM's objects into the views below.
:meth:`KVPlanner.lookup` changes no planner state and nothing stored (vLLM may call it many
times per request); it may only warm the memory tier while checking that chunks are loadable.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Sequence

from vlmcache.keys import MultiModalSpan, block_keys, tenant_scope

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class RequestView:
    """What the planner needs to know of a vLLM request."""

    request_id: str
    prompt_token_ids: Sequence[int]
    spans: tuple[MultiModalSpan, ...]
    tenant: str | None
    bypass: bool = False


@dataclass(frozen=True)
class BlockTransfer:
    """Blocks of one request to move between vLLM's paged KV and the store."""

    request_id: str
    keys: tuple[str, ...]
    block_ids: tuple[int, ...]


@dataclass(frozen=True)
class StepPlan:
    """The work for the worker side in one engine step."""

    loads: tuple[BlockTransfer, ...] = ()
    saves: tuple[BlockTransfer, ...] = ()


@dataclass(frozen=True)
class RequestReuse:
    """What happened to one request, returned to the caller in ``kv_transfer_params``."""

    prompt_tokens: int
    tokens_loaded: int
    tokens_from_prefix_cache: int
    blocks_saved: int
    load_failed_blocks: int
    chunk_keys: tuple[str, ...]
    bypass: bool

    def to_params(self) -> dict[str, object]:
        return {"prompt_tokens": self.prompt_tokens, "tokens_loaded": self.tokens_loaded,
                "tokens_from_prefix_cache": self.tokens_from_prefix_cache,
                "blocks_saved": self.blocks_saved,
                "load_failed_blocks": self.load_failed_blocks,
                "chunk_keys": list(self.chunk_keys), "bypass": self.bypass}


@dataclass
class _Tracked:
    view: RequestView
    keys: list[str]
    block_ids: list[int] = field(default_factory=list)
    saved_blocks: set[int] = field(default_factory=set)
    resave: set[int] = field(default_factory=set)
    load_start: int = 0
    load_blocks: int = 0
    load_pending: bool = False
    failed_blocks: int = 0
    saved_count: int = 0
    l0_tokens: int = 0


class KVPlanner:
    """Finds stored prefixes and turns scheduler steps into load/save plans.

    Args:
        namespace_digest: the deployment's :class:`~vlmcache.keys.Namespace` digest.
        block_size: vLLM's KV block size in tokens.
        contains: store membership test (cheap, side-effect free): decides what to save.
        available: whether a chunk can be loaded *for sure*; a lookup promises only such
            chunks, because vLLM cannot recover every failed load (a multimodal request
            whose image tokens were promised from the store has no encoder output to
            recompute them with). May warm a cache; must not change what is stored.
        load_enabled / save_enabled: the config's switches.
        min_load_tokens: shorter stored prefixes are not loaded.
    """

    def __init__(self, namespace_digest: str, block_size: int,
                 contains: Callable[[str], bool],
                 available: Callable[[str], bool] | None = None, *, load_enabled: bool = True,
                 save_enabled: bool = True, min_load_tokens: int = 1) -> None:
        self.namespace_digest = namespace_digest
        self.block_size = block_size
        self._contains = contains
        self._available = available or contains
        self._load_enabled = load_enabled
        self._save_enabled = save_enabled
        self._min_load_tokens = min_load_tokens
        self._tracked: dict[str, _Tracked] = {}

    def keys_for(self, view: RequestView) -> list[str]:
        """Keys of every full block of the request's prompt."""
        scope = tenant_scope(self.namespace_digest, view.tenant)
        return block_keys(scope, view.prompt_token_ids, view.spans, self.block_size)

    def loadable_blocks(self, num_prompt_tokens: int) -> int:
        """Blocks that may be loaded: vLLM must compute at least the prompt's last token."""
        return max(num_prompt_tokens - 1, 0) // self.block_size

    def lookup(self, view: RequestView, num_computed_tokens: int) -> int:
        """Tokens beyond ``num_computed_tokens`` that the store can supply (block-aligned)."""
        if view.bypass or not self._load_enabled:
            return 0
        keys = self.keys_for(view)[: self.loadable_blocks(len(view.prompt_token_ids))]
        start = num_computed_tokens // self.block_size
        if num_computed_tokens % self.block_size:
            return 0
        end = start
        while end < len(keys) and self._available(keys[end]):
            end += 1
        tokens = (end - start) * self.block_size
        return tokens if tokens >= self._min_load_tokens else 0

    def on_allocated(self, view: RequestView, num_external_tokens: int) -> None:
        """Record a newly scheduled request; ``num_external_tokens`` of it will be loaded."""
        tracked = _Tracked(view=view, keys=self.keys_for(view))
        if num_external_tokens > 0:
            tracked.load_blocks = num_external_tokens // self.block_size
            tracked.load_pending = True
        previous = self._tracked.get(view.request_id)
        if previous is not None:  # resumed after preemption: keep what was saved
            tracked.saved_blocks = previous.saved_blocks
        self._tracked[view.request_id] = tracked

    def on_scheduled(self, request_id: str, block_ids: Sequence[int] | None,
                     replace_blocks: bool, computed_before: int, scheduled: int) -> StepPlan:
        """Plan one scheduled request's loads and saves for this step.

        ``computed_before`` counts tokens already in vLLM's KV (prefix cache and, for a
        request scheduled for the first time, the tokens it is about to load).
        """
        tracked = self._tracked.get(request_id)
        if tracked is None:
            return StepPlan()
        if tracked.load_pending or (replace_blocks and not tracked.block_ids):
            local = computed_before - tracked.load_blocks * self.block_size
            tracked.l0_tokens = max(local, 0)
            tracked.load_start = max(local, 0) // self.block_size
        if block_ids is not None:
            if replace_blocks:
                tracked.block_ids = list(block_ids)
            else:
                tracked.block_ids.extend(block_ids)
        loads = self._take_load(tracked)
        saves = self._plan_saves(tracked, computed_before + scheduled)
        return StepPlan(loads=loads, saves=saves)

    def _take_load(self, tracked: _Tracked) -> tuple[BlockTransfer, ...]:
        if not tracked.load_pending:
            return ()
        tracked.load_pending = False
        span = range(tracked.load_start, tracked.load_start + tracked.load_blocks)
        if span.stop > len(tracked.block_ids) or span.stop > len(tracked.keys):
            logger.error("request %s: load plan exceeds its blocks; not loading",
                         tracked.view.request_id)
            return ()
        tracked.saved_blocks.update(span)  # loaded blocks are stored already
        return (BlockTransfer(tracked.view.request_id,
                              tuple(tracked.keys[i] for i in span),
                              tuple(tracked.block_ids[i] for i in span)),)

    def _plan_saves(self, tracked: _Tracked, computed_after_step: int) -> tuple[BlockTransfer, ...]:
        if not self._save_enabled or tracked.view.bypass:
            return ()
        done = min(computed_after_step // self.block_size, len(tracked.keys),
                   len(tracked.block_ids))
        todo = [i for i in range(done) if i not in tracked.saved_blocks]
        tracked.saved_blocks.update(todo)
        # A block whose stored copy failed to load is rewritten even if a (bad) file exists.
        todo = [i for i in todo if i in tracked.resave or not self._contains(tracked.keys[i])]
        tracked.saved_count += len(todo)
        if not todo:
            return ()
        return (BlockTransfer(tracked.view.request_id,
                              tuple(tracked.keys[i] for i in todo),
                              tuple(tracked.block_ids[i] for i in todo)),)

    def on_load_errors(self, failed_block_ids: set[int]) -> None:
        """Attribute blocks the worker failed to load to their requests (for the report)."""
        for tracked in self._tracked.values():
            start, n = tracked.load_start, tracked.load_blocks
            ids = set(tracked.block_ids[start:start + n])
            hit = len(ids & failed_block_ids)
            if hit:
                tracked.failed_blocks += hit
                failed = {i for i in range(start, start + n)
                          if tracked.block_ids[i] in failed_block_ids}
                tracked.saved_blocks.difference_update(failed)
                tracked.resave.update(failed)

    def finish(self, request_id: str) -> RequestReuse | None:
        """Forget a finished request and say what it reused."""
        tracked = self._tracked.pop(request_id, None)
        if tracked is None:
            return None
        loaded_blocks = tracked.load_blocks
        if tracked.failed_blocks:
            loaded_blocks = 0  # vLLM recomputes from the first failed block on
        return RequestReuse(
            prompt_tokens=len(tracked.view.prompt_token_ids),
            tokens_loaded=loaded_blocks * self.block_size,
            tokens_from_prefix_cache=tracked.l0_tokens,
            blocks_saved=tracked.saved_count,
            load_failed_blocks=tracked.failed_blocks,
            chunk_keys=tuple(tracked.keys),
            bypass=tracked.view.bypass,
        )
