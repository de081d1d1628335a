"""Worker-side KV movement between vLLM's paged KV tensors and the chunk store.

Plain torch, no vLLM import. A chunk holds one KV block of every attention layer
(``{layer_name: tensor}``); a chunk whose layers, shapes or dtypes do not match this engine's
KV cache is a fault, so it is a miss, never loaded.
"""

from __future__ import annotations

import logging
from typing import Mapping, Protocol, Sequence

import torch

from vlmcache.vllm.plan import BlockTransfer

logger = logging.getLogger(__name__)


class KVChunkStore(Protocol):
    """What the worker needs of a store (a :class:`~vlmcache.store.TieredStore`)."""

    def get(self, key: str) -> dict[str, torch.Tensor] | None: ...

    def put(self, key: str, tensors: Mapping[str, torch.Tensor]) -> bool: ...

    def delete(self, key: str) -> bool: ...


class PagedKV:
    """Block-granular reads and writes on vLLM's per-layer paged KV tensors.

    Args:
        kv_caches: vLLM's ``{layer_name: kv_cache}`` as given to ``register_kv_caches``.
        num_blocks: the number of KV blocks vLLM allocated; locates the block dimension.
        block_dim_hint: the block dimension to use when the shape is ambiguous.
    """

    def __init__(self, kv_caches: Mapping[str, torch.Tensor], num_blocks: int,
                 block_dim_hint: int = 0) -> None:
        if not kv_caches:
            raise ValueError("no KV cache tensors were registered")
        self.layers = dict(sorted(kv_caches.items()))
        self.num_blocks = num_blocks
        self.block_dims = {name: _block_dim(t, num_blocks, block_dim_hint)
                           for name, t in self.layers.items()}

    def block_spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Per layer: the shape and dtype of one block."""
        spec = {}
        for name, t in self.layers.items():
            shape = list(t.shape)
            del shape[self.block_dims[name]]
            spec[name] = (tuple(shape), t.dtype)
        return spec

    def bytes_per_block(self) -> int:
        return sum(t.element_size() * t.numel() // self.num_blocks for t in self.layers.values())

    def read_blocks(self, block_ids: Sequence[int]) -> list[dict[str, torch.Tensor]]:
        """CPU copies of the given blocks, one ``{layer: tensor}`` per block."""
        chunks: list[dict[str, torch.Tensor]] = [{} for _ in block_ids]
        for name, t in self.layers.items():
            dim = self.block_dims[name]
            idx = torch.tensor(list(block_ids), dtype=torch.long, device=t.device)
            picked = t.index_select(dim, idx).to("cpu")
            for i, part in enumerate(picked.unbind(dim)):
                chunks[i][name] = part.contiguous()
        return chunks

    def write_blocks(self, block_ids: Sequence[int], chunks: Sequence[Mapping[str, torch.Tensor]]) -> None:
        """Write validated chunks into the given blocks (all layers)."""
        if not block_ids:
            return
        for name, t in self.layers.items():
            dim = self.block_dims[name]
            idx = torch.tensor(list(block_ids), dtype=torch.long, device=t.device)
            src = torch.stack([c[name] for c in chunks], dim=dim).to(t.device, non_blocking=True)
            t.index_copy_(dim, idx, src)

    def matches(self, chunk: Mapping[str, torch.Tensor]) -> str | None:
        """``None`` if the chunk fits this KV cache, else what is wrong with it."""
        spec = self.block_spec()
        if set(chunk) != set(spec):
            return f"layers differ ({len(chunk)} stored vs {len(spec)} in the engine)"
        for name, (shape, dtype) in spec.items():
            got = chunk[name]
            if tuple(got.shape) != shape or got.dtype != dtype:
                return (f"layer {name}: stored {tuple(got.shape)} {got.dtype}, "
                        f"engine {shape} {dtype}")
        return None


def _block_dim(t: torch.Tensor, num_blocks: int, hint: int) -> int:
    dims = [d for d in range(t.dim()) if t.shape[d] == num_blocks]
    if not dims:
        raise ValueError(f"KV cache of shape {tuple(t.shape)} has no dimension of "
                         f"{num_blocks} blocks")
    return hint if hint in dims else dims[0]


class KVTransfer:
    """Loads planned blocks from the store into paged KV and saves computed blocks."""

    def __init__(self, paged: PagedKV, store: KVChunkStore) -> None:
        self.paged = paged
        self.store = store
        self.blocks_loaded = 0
        self.blocks_saved = 0
        self.load_faults = 0

    def load(self, transfers: Sequence[BlockTransfer]) -> set[int]:
        """Load every planned block; returns the block ids that could not be loaded.

        A block that fails makes the rest of its request's loaded prefix useless, so those
        are reported too; vLLM then recomputes them. Their stored copies are dropped (unread
        ones may be bad too) so the recomputed blocks replace them.
        """
        failed: set[int] = set()
        good_ids: list[int] = []
        good_chunks: list[dict[str, torch.Tensor]] = []
        for transfer in transfers:
            for i, (key, block_id) in enumerate(zip(transfer.keys, transfer.block_ids)):
                chunk = self._fetch(key, transfer.request_id)
                if chunk is None:
                    failed.update(transfer.block_ids[i:])
                    for stale in transfer.keys[i:]:
                        self.store.delete(stale)
                    break
                good_ids.append(block_id)
                good_chunks.append(chunk)
        try:
            self.paged.write_blocks(good_ids, good_chunks)
        except (RuntimeError, ValueError) as exc:
            logger.warning("writing %d loaded blocks into the KV cache failed: %s; "
                           "they will be recomputed", len(good_ids), exc)
            failed.update(good_ids)
            good_ids = []
        self.blocks_loaded += len(good_ids)
        self.load_faults += len(failed)
        return failed

    def _fetch(self, key: str, request_id: str) -> dict[str, torch.Tensor] | None:
        chunk = self.store.get(key)
        if chunk is None:
            logger.warning("request %s: KV chunk %s is gone or unreadable; recomputing",
                           request_id, key[:16])
            return None
        problem = self.paged.matches(chunk)
        if problem is not None:
            logger.warning("request %s: KV chunk %s does not fit this engine (%s); "
                           "recomputing", request_id, key[:16], problem)
            return None
        return chunk

    def save(self, transfers: Sequence[BlockTransfer]) -> int:
        """Copy the planned blocks out of paged KV into the store; returns blocks kept."""
        kept = 0
        for transfer in transfers:
            chunks = self.paged.read_blocks(transfer.block_ids)
            for key, chunk in zip(transfer.keys, chunks):
                kept += bool(self.store.put(key, chunk))
        self.blocks_saved += kept
        return kept
