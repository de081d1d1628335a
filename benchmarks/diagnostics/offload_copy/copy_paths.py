"""Where a CPU-tier hit's load time goes on the GPU: vLLM 0.26's own offloading copy
handler (``SingleDirectionOffloadingHandler``) moving one prompt's KV between the GPU and
each kind of CPU buffer vLLM's specs use, with each copy function it can pick.

- ``pinned``: ``torch.zeros(pin_memory=True)``, what ``CPUOffloadingSpec`` allocates.
- ``shm``: a ``SharedOffloadRegion`` (``/dev/shm`` mmap + ``cudaHostRegister``), what
  ``TieringOffloadingSpec`` (and vlmcache's spec, its subclass) allocates.
- copy function: ``auto`` (vLLM's choice: its Triton kernel for CPU->GPU pages < 28 KiB,
  the GQA shape), ``dma`` (``ops.swap_blocks_batch``), ``triton`` (forced).

Shapes are the 7B geometries' canonical KV tensors (K and V of each layer, one page per
16-token block). Prints and writes JSON: per case, the median and p90 of the GPU time
(CUDA events), of the wall time submit -> synchronized, and of the submit's CPU time.

    PYTHONPATH=/root/site python benchmarks/diagnostics/offload_copy/copy_paths.py --out X.json
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
import uuid

import numpy as np
import torch

from vllm import _custom_ops as ops
from vllm.triton_utils import triton
from vllm.v1.kv_offload.base import CanonicalKVCacheRef, GPULoadStoreSpec
from vllm.v1.kv_offload.cpu import gpu_worker
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion
from vllm.v1.kv_offload.cpu.swap_blocks_triton import swap_blocks_batch

#: name -> (canonical tensors = 2 x layers, bytes per 16-token page of one tensor)
SHAPES = {"qwen2vl7b": (56, 16 * 4 * 128 * 2), "llava7b": (64, 16 * 32 * 128 * 2)}


def _buffers(kind: str, tensors: int, page: int, cpu_blocks: int):
    if kind == "pinned":
        return [torch.zeros((cpu_blocks, page), dtype=torch.int8, pin_memory=True)
                for _ in range(tensors)], None
    row = tensors * page
    region = SharedOffloadRegion(engine_id=f"copybench-{uuid.uuid4().hex[:8]}",
                                 num_blocks=cpu_blocks, rank=0, kv_bytes_per_block=row,
                                 cpu_page_size=row)
    gpu_worker.pin_mmap_region(region)
    return [region.create_next_view(page) for _ in range(tensors)], region


def _copy_fn(name: str, page: int, gpu_to_cpu: bool, refs):
    if name == "auto":
        return gpu_worker._select_swap_blocks_fn(refs, gpu_to_cpu)
    if name == "dma":
        return ops.swap_blocks_batch
    chunk = min(triton.next_power_of_2(page), 8192)
    return functools.partial(swap_blocks_batch, bytes_per_chunk=chunk)


def _case(shape: str, kind: str, fn: str, direction: str, args) -> dict:
    tensors, page = SHAPES[shape]
    gpu = [torch.zeros((args.gpu_blocks, page), dtype=torch.int8, device="cuda")
           for _ in range(tensors)]
    cpu, region = _buffers(kind, tensors, page, args.cpu_blocks)
    refs = [[CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=page) for i in range(tensors)]]
    to_cpu = direction == "store"
    handler = gpu_worker.SingleDirectionOffloadingHandler(
        gpu_tensors=gpu, cpu_tensors=cpu, blocks_per_chunk=1,
        kv_cache_groups_data_refs=refs, gpu_to_cpu=to_cpu, mmap_region=region)
    handler._swap_blocks_batch = _copy_fn(fn, page, to_cpu, refs)
    rng = np.random.default_rng(0)
    gpu_ms, wall_ms, submit_ms = [], [], []
    for i in range(args.warmup + args.reps):
        n = args.blocks
        g_ids = rng.choice(args.gpu_blocks, n, replace=False).tolist()
        c_ids = rng.choice(args.cpu_blocks, n, replace=False).tolist()
        g_spec = GPULoadStoreSpec(g_ids, group_sizes=[n], block_indices=[0])
        c_spec = CPULoadStoreSpec(c_ids)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        handler.transfer_async(i, g_spec if to_cpu else c_spec, c_spec if to_cpu else g_spec)
        t1 = time.perf_counter()
        handler.wait({i})
        t2 = time.perf_counter()
        done = handler.get_finished()
        if i >= args.warmup:
            submit_ms.append((t1 - t0) * 1e3)
            wall_ms.append((t2 - t0) * 1e3)
            gpu_ms.append(done[0].transfer_time * 1e3)
    handler.shutdown()
    del gpu, cpu
    torch.cuda.empty_cache()
    mb = args.blocks * tensors * page / 1e6

    def stat(xs):
        xs = sorted(xs)
        return {"median": round(statistics.median(xs), 3),
                "p90": round(xs[int(0.9 * (len(xs) - 1))], 3)}

    row = {"shape": shape, "buffer": kind, "copy_fn": fn, "direction": direction,
           "mb": round(mb, 1), "gpu_ms": stat(gpu_ms), "wall_ms": stat(wall_ms),
           "submit_ms": stat(submit_ms)}
    row["gb_per_s"] = round(mb / 1e3 / (row["gpu_ms"]["median"] / 1e3), 2)
    print(json.dumps(row), flush=True)
    return row


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="qwen2vl7b,llava7b")
    p.add_argument("--blocks", type=int, default=42, help="blocks per transfer (a prompt)")
    p.add_argument("--gpu-blocks", type=int, default=2048)
    p.add_argument("--cpu-blocks", type=int, default=512)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    rows = []
    for shape in args.shapes.split(","):
        for direction in ("load", "store"):
            for kind in ("pinned", "shm"):
                for fn in ("auto", "dma", "triton"):
                    rows.append(_case(shape, kind, fn, direction, args))
    meta = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "blocks": args.blocks, "reps": args.reps}
    with open(args.out, "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
