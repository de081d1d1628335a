"""Does a KV store delay the sampled token's copy to the host? The engine's order, replayed
without an engine: a forward's worth of work on the main stream, then the sampled tokens
copied to the host on their own stream (vLLM's ``AsyncOutput``), then the previous step's
deferred store (vLLM's offloading worker: its own stream, waiting on the main stream) of
one prompt's KV (42 blocks of the 7B shapes) through vLLM's copy handler.

Per case, the median over reps of: main stream done -> token copy done (GPU events), and
the host's wait for the token copy after submitting everything. Cases: no store; the whole
store after the token copy was enqueued; the same split in parts; the store ordered after
the token copy (waits on its event); the store submitted before the forward, as vLLM
submits the previous step's deferred store (``--layers`` sets the forward's length: 400
reads ~13 GB of weights, about a 7B model's short step).

    PYTHONPATH=/root/site python benchmarks/diagnostics/offload_copy/token_race.py --out X.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
import torch

from vllm.v1.kv_offload.base import CanonicalKVCacheRef, GPULoadStoreSpec
from vllm.v1.kv_offload.cpu import gpu_worker
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec

SHAPES = {"qwen2vl7b": (56, 16 * 4 * 128 * 2), "llava7b": (64, 16 * 32 * 128 * 2)}


def _handler(shape: str, args):
    tensors, page = SHAPES[shape]
    gpu = [torch.zeros((args.gpu_blocks, page), dtype=torch.int8, device="cuda")
           for _ in range(tensors)]
    cpu = [torch.zeros((args.cpu_blocks, page), dtype=torch.int8, pin_memory=True)
           for _ in range(tensors)]
    refs = [[CanonicalKVCacheRef(tensor_idx=i, page_size_bytes=page) for i in range(tensors)]]
    return gpu_worker.SingleDirectionOffloadingHandler(
        gpu_tensors=gpu, cpu_tensors=cpu, blocks_per_chunk=1,
        kv_cache_groups_data_refs=refs, gpu_to_cpu=True)


def _store(handler, case: str, job: int, args, rng) -> None:
    n = args.blocks
    g = rng.choice(args.gpu_blocks, n, replace=False).tolist()
    c = rng.choice(args.cpu_blocks, n, replace=False).tolist()
    parts = args.parts if case == "split" else 1
    for p, (gs, cs) in enumerate(zip(np.array_split(g, parts), np.array_split(c, parts))):
        handler.transfer_async(job * 100 + p, GPULoadStoreSpec(gs.tolist(), [len(gs)], [0]),
                               CPULoadStoreSpec(cs.tolist()))


def _step(handler, case: str, job: int, args, weights, rng) -> tuple[float, float]:
    main = torch.cuda.current_stream()
    copy_stream = args.copy_stream
    if case == "before_forward":  # vLLM: the previous step's store, at this step's start
        _store(handler, case, job, args, rng)
    x = torch.randn(args.tokens, 4096, device="cuda", dtype=torch.bfloat16)
    for w in weights:  # a forward's worth of weight reads
        x = torch.tanh(x @ w)
    main_done = torch.cuda.Event(enable_timing=True)
    main_done.record(main)
    host = torch.empty(args.tokens, dtype=torch.bfloat16, pin_memory=True)
    with torch.cuda.stream(copy_stream):
        copy_stream.wait_stream(main)
        host.copy_(x[:, 0], non_blocking=True)
        token_done = torch.cuda.Event(enable_timing=True, blocking=True)
        token_done.record(copy_stream)
    if case in ("whole", "split", "after_token"):
        if case == "after_token":
            # the store stream is taken from the handler's pool; make the next one wait
            main.wait_event(token_done)
        _store(handler, case, job, args, rng)
    t0 = time.perf_counter()
    token_done.synchronize()
    host_ms = (time.perf_counter() - t0) * 1e3
    torch.cuda.synchronize()
    handler.get_finished()
    return main_done.elapsed_time(token_done), host_ms


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shapes", default="llava7b,qwen2vl7b")
    p.add_argument("--blocks", type=int, default=42)
    p.add_argument("--gpu-blocks", type=int, default=1024)
    p.add_argument("--cpu-blocks", type=int, default=256)
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--layers", type=int, default=64, help="4096x4096 matmuls per forward")
    p.add_argument("--parts", type=int, default=8)
    p.add_argument("--reps", type=int, default=25)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    args.copy_stream = torch.cuda.Stream()
    weights = [torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16) / 64
               for _ in range(args.layers)]
    rng = np.random.default_rng(0)
    rows = []
    for shape in args.shapes.split(","):
        handler = _handler(shape, args)
        for case in ("none", "whole", "split", "after_token", "before_forward", "none"):
            gpu, host = [], []
            for r in range(args.reps + 3):
                g, h = _step(handler, case, r, args, weights, rng)
                if r >= 3:
                    gpu.append(g)
                    host.append(h)
            row = {"shape": shape, "case": case,
                   "main_done_to_token_ms": round(statistics.median(gpu), 3),
                   "host_wait_ms": round(statistics.median(host), 3)}
            print(json.dumps(row), flush=True)
            rows.append(row)
        handler.shutdown()
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "args": {
            k: v for k, v in vars(args).items() if k != "copy_stream"}, "rows": rows}, f,
            indent=1)


if __name__ == "__main__":
    main()
