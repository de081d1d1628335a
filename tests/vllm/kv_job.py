"""One engine process for the KV-path tests (run as a script: engines start in subprocesses).

    python tests/vllm/kv_job.py --mode memory|disk-async --model DIR --store DIR --out FILE

``memory``: a memory-only store (``disk_budget: 0``); each seed is asked, vLLM's prefix cache
is reset, and the seed is asked again (the second answer can only come from vlmcache's CPU
tier, which lives beside the scheduler while the model runs in another process).
``memory-second-sight``: the same with ``admission_memory: second_sight``; between the first
answer and the reset the seed is asked once more (a GPU prefix hit, which must not count),
and after the reset it is asked twice more, with a reset between (the first computation is
not captured, the second is).
``disk-async``: ``disk_write: async``; each seed is asked once (the first process stores, a
second process with the same arguments loads).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--mode", choices=("memory", "memory-second-sight", "disk-async"), required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    args = parser.parse_args()

    from vlmcache.api import CachedLLM
    from vlmcache.config import VlmCacheConfig
    from vlmcache.testing.engine_job import BLOCK_SIZE, engine_args, greedy, make_request

    memory = args.mode.startswith("memory")
    admission = "second_sight" if args.mode == "memory-second-sight" else "always"
    config = VlmCacheConfig(store_path=args.store, block_size=BLOCK_SIZE,
                            memory_budget=256 * 1024**2, disk_budget=0 if memory else 1024**3,
                            disk_write="async", enable_exact=False,
                            enable_encoder_cache=False, admission_memory=admission)
    llm = CachedLLM(args.model, config, engine_args=engine_args())
    results = []
    try:
        for seed in args.seeds:
            first = llm.generate([make_request(seed)], greedy())[0]
            results.append({"seed": seed, "phase": "first", "token_ids": first.token_ids,
                            "report": first.report.to_dict()})
            if admission == "second_sight":
                hit = llm.generate([make_request(seed)], greedy())[0]
                results.append({"seed": seed, "phase": "gpu-hit", "token_ids": hit.token_ids,
                                "report": hit.report.to_dict()})
            for _ in range((2 if admission == "second_sight" else 1) if memory else 0):
                llm.llm.reset_prefix_cache()
                again = llm.generate([make_request(seed)], greedy())[0]
                results.append({"seed": seed, "phase": "after-reset",
                                "token_ids": again.token_ids, "report": again.report.to_dict()})
    finally:
        llm.close()
    Path(args.out).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
