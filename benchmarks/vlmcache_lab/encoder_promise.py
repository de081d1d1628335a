"""What the scheduler's promise of a stored encoder output costs its loop.

vLLM's scheduler asks the encoder-cache connector, per media item it would encode, whether
the output is stored (``has_cache_item``); the answer blocks the scheduling step. Until
2026-11-29 vlmcache answered by reading and verifying the output into the scheduler's own
memory (``TieredStore.get``'s work: the safetensors file, its sha256), although under vLLM's
``mp`` executor the worker reads and verifies its own copy anyway. It now answers from the
store's index (``EncoderPlanner.has`` over ``contains``). For one output of each size, on
disk (page cache warm, as right after the engine wrote it), this times both answers.

    python benchmarks/encoder_promise.py --out benchmarks/results/encoder-promise.json
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Sequence

import torch

from vlmcache.keys import image_uuid
from vlmcache.store import DiskStore, MemoryStore, TieredStore
from vlmcache.vllm.encoder_plan import TENSOR_NAME, EncoderPlanner
from vlmcache_lab.phase_timing import median_ms

#: (name, embeds, hidden): a LLaVA-1.5-7B image; a 60-frame 224 px clip on Qwen2-VL-7B
SHAPES = (("llava7b-image", 576, 4096), ("qwen2vl7b-60-frame-clip", 4320, 3584))


def measure(root: Path, embeds: int, hidden: int, repeats: int) -> dict[str, float]:
    """Median ms of the scheduler's old answer (read + verify) and its new one (index)."""
    identifier = image_uuid("", "tenant-a", "a" * 64)
    store = TieredStore(MemoryStore(1 << 34), DiskStore(root, 1 << 34))
    planner = EncoderPlanner("ns", store.contains)
    key = planner.key(identifier)
    store.put(key, {TENSOR_NAME: torch.randn(embeds, hidden).to(torch.bfloat16)})
    store.flush()
    store.memory.delete(key)  # the scheduler's process holds no copy of what the worker wrote

    def old_answer() -> None:
        assert store.get(key) is not None
        store.memory.delete(key)

    old = median_ms(old_answer, repeats)
    new = median_ms(lambda: planner.has(identifier), repeats)
    return {"mb": round(embeds * hidden * 2 / 1e6, 2), "read_and_verify_ms": old,
            "index_ms": new}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out", required=True)
    args = p.parse_args(argv)
    rows = {}
    for name, embeds, hidden in SHAPES:
        with tempfile.TemporaryDirectory() as tmp:
            rows[name] = measure(Path(tmp), embeds, hidden, args.repeats)
        print(name, rows[name], flush=True)
    result = {"command": "python benchmarks/encoder_promise.py " + shlex.join(
                  list(argv if argv is not None else sys.argv[1:])),
              "device": f"{platform.processor() or platform.machine()} CPU, "
                        f"{len(__import__('os').sched_getaffinity(0))} cores",
              "repeats": args.repeats, "shapes": rows,
              "notes": ["Per answer, median of the repeats: read_and_verify_ms is what the "
                        "scheduler's loop spent per stored output before (TieredStore.get of a "
                        "disk-resident output: file read from the page cache, sha256 over "
                        "names, shapes and bytes); index_ms is EncoderPlanner.has now. The "
                        "worker's own read is unchanged and not counted in either."]}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0
