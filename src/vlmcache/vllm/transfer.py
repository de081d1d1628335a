"""Worker-side KV movement between vLLM's paged KV tensors and the chunk store.

Plain torch, no vLLM import. A chunk holds one KV block of every attention layer
(``{layer_name: tensor}``); a chunk whose layers, shapes or dtypes do not match this engine's
KV cache is a fault, so it is a miss, never loaded.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

import torch

from vlmcache.vllm.plan import BlockTransfer

logger = logging.getLogger(__name__)


#: Blocks per pinned host slab: one size for every slab, so freed slabs are recycled.
SLAB_BLOCKS = 16
#: Bytes of captured KV that may wait for the host copy before new captures are dropped.
SAVE_QUEUE_MAX_BYTES = 4 * 1024**3


class KVChunkStore(Protocol):
    """What the worker needs of a store (a :class:`~vlmcache.store.TieredStore`)."""

    def get(self, key: str) -> dict[str, torch.Tensor] | None: ...

    def put(self, key: str, tensors: Mapping[str, torch.Tensor], *, owned: bool = False) -> bool: ...

    def delete(self, key: str) -> bool: ...


class PagedKV:
    """Block-granular reads and writes on vLLM's per-layer paged KV tensors.

    Host copies are block-major: per layer, slabs of ``SLAB_BLOCKS`` blocks, each block a
    contiguous view. On a GPU the slabs are pinned and all of one size, so torch's caching
    host allocator recycles them (pre-warmed up to ``pinned_bytes`` at start-up): a save
    gathers its blocks on the compute stream and copies them out on a side stream, without
    waiting; a load moves each run of adjacent blocks with one asynchronous copy.

    Args:
        kv_caches: vLLM's ``{layer_name: kv_cache}`` as given to ``register_kv_caches``.
        num_blocks: the number of KV blocks vLLM allocated; locates the block dimension.
        block_dim_hint: the block dimension to use when the shape alone cannot tell.
        pinned_bytes: pinned host memory to allocate (and cache) up front, on a GPU.
    """

    def __init__(self, kv_caches: Mapping[str, torch.Tensor], num_blocks: int,
                 block_dim_hint: int = 0, pinned_bytes: int = 0) -> None:
        if not kv_caches:
            raise ValueError("no KV cache tensors were registered")
        self.layers = dict(sorted(kv_caches.items()))
        self.num_blocks = num_blocks
        self.block_dims = {name: _block_dim(t, num_blocks, block_dim_hint)
                           for name, t in self.layers.items()}
        self.device = next(iter(self.layers.values())).device
        self._spec = self._compute_spec()
        self._bytes_per_block = sum(t.element_size() * t.numel() // num_blocks
                                    for t in self.layers.values())
        self._copy_stream: Any = None
        if self.on_gpu and pinned_bytes > 0:
            self._prewarm_pinned(pinned_bytes)

    def _compute_spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        spec = {}
        for name, t in self.layers.items():
            shape = list(t.shape)
            del shape[self.block_dims[name]]
            spec[name] = (tuple(shape), t.dtype)
        return spec

    def _prewarm_pinned(self, budget: int) -> None:
        """Allocate and free pinned slabs so later saves reuse them (no cudaHostAlloc)."""
        start = time.perf_counter()
        slabs = []
        shape, dtype = next(iter(self._spec.values()))
        one = SLAB_BLOCKS * torch.Size(shape).numel() * dtype.itemsize
        for _ in range(max(0, budget // max(one, 1))):
            slabs.append(torch.empty((SLAB_BLOCKS, *shape), dtype=dtype, pin_memory=True))
        del slabs
        logger.info("vlmcache: %d MiB of pinned host memory ready in %.1f s",
                    budget >> 20, time.perf_counter() - start)

    def block_spec(self) -> dict[str, tuple[tuple[int, ...], torch.dtype]]:
        """Per layer: the shape and dtype of one block."""
        return dict(self._spec)

    def bytes_per_block(self) -> int:
        return self._bytes_per_block

    @property
    def on_gpu(self) -> bool:
        return self.device.type == "cuda"

    def read_blocks(self, block_ids: Sequence[int]) -> list[dict[str, torch.Tensor]]:
        """Host copies of the given blocks, one ``{layer: tensor}`` per block (waits)."""
        staged = self.read_blocks_async(block_ids)
        if staged.ready is not None:
            staged.ready.synchronize()
        return staged.chunks()

    def read_blocks_async(self, block_ids: Sequence[int]) -> "StagedBlocks":
        """The given blocks, copied out without waiting for a GPU.

        The blocks are gathered on the compute stream first (later kernels cannot overwrite
        them before they are read); on a GPU the host copy runs on a side stream and the
        result's ``ready`` event completes when it has.
        """
        views: dict[str, list[torch.Tensor]] = {}
        idx = torch.tensor(list(block_ids), dtype=torch.long, device=self.device)
        gathered = {name: t.index_select(self.block_dims[name], idx)
                    .movedim(self.block_dims[name], 0).contiguous()
                    for name, t in self.layers.items()}
        if not self.on_gpu:
            for name, g in gathered.items():
                views[name] = list(g.unbind(0))
            return StagedBlocks(views, len(block_ids), None)
        ready = self._copy_to_pinned(gathered, views)
        return StagedBlocks(views, len(block_ids), ready)

    def _copy_to_pinned(self, gathered: dict[str, torch.Tensor],
                        views: dict[str, list[torch.Tensor]]) -> Any:
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream(device=self.device)
        stream = self._copy_stream
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for name, g in gathered.items():
                views[name] = []
                for start in range(0, g.shape[0], SLAB_BLOCKS):
                    part = g[start:start + SLAB_BLOCKS]
                    slab = torch.empty((SLAB_BLOCKS, *g.shape[1:]), dtype=g.dtype,
                                       pin_memory=True)
                    slab[:part.shape[0]].copy_(part, non_blocking=True)
                    views[name].extend(slab[:part.shape[0]].unbind(0))
                g.record_stream(stream)  # its memory is not reused before the copy ran
            ready = torch.cuda.Event()
            ready.record(stream)
        return ready

    def write_blocks(self, block_ids: Sequence[int], chunks: Sequence[Mapping[str, torch.Tensor]]) -> None:
        """Write validated chunks into the given blocks (all layers).

        Host-to-device copies are asynchronous on the compute stream, so the forward pass
        that follows sees them; runs of chunks that are adjacent views of one host slab
        (as saved by :meth:`read_blocks_async`) move in one copy.
        """
        if not block_ids:
            return
        idx = torch.tensor(list(block_ids), dtype=torch.long, device=self.device)
        for name, t in self.layers.items():
            runs = _runs([c[name] for c in chunks], self.on_gpu)
            parts = [_to_device(run, t.device) for run in runs]
            src = parts[0] if len(parts) == 1 else torch.cat(parts, dim=0)
            t.index_copy_(self.block_dims[name], idx, src.movedim(0, self.block_dims[name]))

    def matches(self, chunk: Mapping[str, torch.Tensor]) -> str | None:
        """``None`` if the chunk fits this KV cache, else what is wrong with it."""
        spec = self._spec
        if len(chunk) != len(spec) or set(chunk) != set(spec):
            return f"layers differ ({len(chunk)} stored vs {len(spec)} in the engine)"
        for name, (shape, dtype) in spec.items():
            got = chunk[name]
            if tuple(got.shape) != shape or got.dtype != dtype:
                return (f"layer {name}: stored {tuple(got.shape)} {got.dtype}, "
                        f"engine {shape} {dtype}")
        return None


@dataclass
class StagedBlocks:
    """Blocks copied out of paged KV: per layer, one contiguous host view per block."""

    views: dict[str, list[torch.Tensor]]
    count: int
    ready: Any = None  # a CUDA event while a device-to-host copy may still run

    @property
    def nbytes(self) -> int:
        return sum(v.numel() * v.element_size() for vs in self.views.values() for v in vs)

    def chunks(self) -> list[dict[str, torch.Tensor]]:
        """One ``{layer: view}`` per block (no copies)."""
        return [{name: vs[i] for name, vs in self.views.items()} for i in range(self.count)]


def _to_device(src: torch.Tensor, device: torch.device) -> torch.Tensor:
    if src.device == device:
        return src
    if device.type == "cuda" and not src.is_pinned():
        # e.g. chunks read from disk: one host copy into (recycled) pinned memory first
        staged = torch.empty(src.shape, dtype=src.dtype, pin_memory=True)
        staged.copy_(src)
        src = staged
    return src.contiguous().to(device, non_blocking=True)


def _runs(parts: Sequence[torch.Tensor], pinned: bool) -> list[torch.Tensor]:
    """``parts`` stacked block-major, as few tensors as possible: a run of parts that are
    adjacent contiguous views of one buffer becomes one view of it (no copy); others are
    stacked into a new (pinned, for a GPU) buffer."""
    runs: list[torch.Tensor] = []
    loose: list[torch.Tensor] = []
    i = 0
    while i < len(parts):
        j, view = _adjacent_run(parts, i)
        if view is None:
            loose.append(parts[i])
            i += 1
            continue
        if loose:
            runs.append(_stack(loose, pinned))
            loose = []
        runs.append(view)
        i = j
    if loose:
        runs.append(_stack(loose, pinned))
    return runs


def _adjacent_run(parts: Sequence[torch.Tensor], i: int) -> tuple[int, torch.Tensor | None]:
    """(end, view) of the longest run from ``i`` of >= 2 contiguous parts that follow each
    other in one storage; ``(i + 1, None)`` when there is none."""
    first = parts[i]
    if i + 1 >= len(parts) or first.device.type != "cpu" or not first.is_contiguous():
        return i + 1, None
    ptr, base, step = first.untyped_storage().data_ptr(), first.storage_offset(), first.numel()
    j = i + 1
    while (j < len(parts) and parts[j].untyped_storage().data_ptr() == ptr
           and parts[j].storage_offset() == base + (j - i) * step
           and parts[j].shape == first.shape and parts[j].is_contiguous()):
        j += 1
    if j - i < 2:
        return i + 1, None
    return j, first.as_strided((j - i, *first.shape), (step, *first.stride()), base)


def _stack(parts: Sequence[torch.Tensor], pinned: bool) -> torch.Tensor:
    out = torch.empty((len(parts), *parts[0].shape), dtype=parts[0].dtype, pin_memory=pinned)
    return torch.stack(list(parts), dim=0, out=out)


def _block_dim(t: torch.Tensor, num_blocks: int, hint: int) -> int:
    dims = [d for d in range(t.dim()) if t.shape[d] == num_blocks]
    if not dims:
        raise ValueError(f"KV cache of shape {tuple(t.shape)} has no dimension of "
                         f"{num_blocks} blocks")
    return hint if hint in dims else dims[0]


class KVTransfer:
    """Loads planned blocks from the store into paged KV and saves computed blocks.

    On a GPU, saves do not wait for the device-to-host copy: a background thread puts the
    chunks into the store once their copy has completed (:meth:`flush` waits for that).
    Capture must never slow serving down: while more than ``max_pending_bytes`` of saves
    wait, further saves are dropped (they are misses later).
    """

    def __init__(self, paged: PagedKV, store: KVChunkStore,
                 max_pending_bytes: int = SAVE_QUEUE_MAX_BYTES) -> None:
        self.paged = paged
        self.store = store
        self.max_pending_bytes = max_pending_bytes
        self.blocks_loaded = 0
        self.blocks_saved = 0
        self.blocks_dropped = 0
        self.load_faults = 0
        self._pending: queue.Queue[tuple[tuple[str, ...], StagedBlocks]] = queue.Queue()
        self._pending_bytes = 0
        self._saver: threading.Thread | None = None
        self._lock = threading.Lock()

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
        """Copy the planned blocks out of paged KV into the store; returns the blocks kept
        now (on a GPU they are queued, and counted in ``blocks_saved`` once stored)."""
        kept = 0
        for transfer in transfers:
            if not self._admit(transfer):
                continue
            staged = self.paged.read_blocks_async(transfer.block_ids)
            if staged.ready is None:
                kept += self._put(transfer.keys, staged.chunks())
                continue
            with self._lock:
                self._pending_bytes += staged.nbytes
            self._start_saver()
            self._pending.put((tuple(transfer.keys), staged))
        return kept

    def _admit(self, transfer: BlockTransfer) -> bool:
        if not self.paged.on_gpu:
            return True
        with self._lock:
            full = self._pending_bytes + len(transfer.block_ids) * self.paged.bytes_per_block() \
                > self.max_pending_bytes
            if full:
                self.blocks_dropped += len(transfer.block_ids)
        if full:
            logger.debug("request %s: %d blocks not captured (%d bytes of saves pending)",
                         transfer.request_id, len(transfer.block_ids), self._pending_bytes)
        return not full

    def _put(self, keys: Sequence[str], chunks: Sequence[dict[str, torch.Tensor]]) -> int:
        # the chunks are views of buffers made for this save alone: the store may keep them
        kept = sum(bool(self.store.put(key, chunk, owned=True)) for key, chunk in zip(keys, chunks))
        self.blocks_saved += kept
        return kept

    def _start_saver(self) -> None:
        with self._lock:
            if self._saver is None:
                self._saver = threading.Thread(target=self._save_loop, name="vlmcache-kv-save",
                                               daemon=True)
                self._saver.start()

    def _save_loop(self) -> None:
        while True:
            keys, staged = self._pending.get()
            try:
                staged.ready.synchronize()
                self._put(keys, staged.chunks())
            except Exception:  # a failed save is a miss later, never a crash now
                logger.exception("saving %d KV chunks failed", len(keys))
            finally:
                with self._lock:
                    self._pending_bytes -= staged.nbytes
                self._pending.task_done()

    def flush(self) -> None:
        """Wait until every queued save is in the store."""
        self._pending.join()
