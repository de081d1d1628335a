"""Run a fixed set of tiny-LLaVA requests in a fresh engine process and dump the results.

Integration tests start this as a separate process (``python -m vlmcache.testing.engine_job``)
to play "another engine" against a shared store, or a plain vLLM baseline::

    python -m vlmcache.testing.engine_job --mode cache --model DIR --store DIR \\
        --seeds 0 1 2 --out results.json
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any, Sequence

from vlmcache.testing.tiny_llava import TINY_LLAVA_PROMPT, make_test_image

#: A question long enough that one 256-token image plus text exceeds 320 prompt tokens.
QUESTION = ("Please describe in detail every colored shape that you can see in this picture "
            "and say where each of them is placed.")
#: A different question about the same images (shares the image blocks, not the text).
ALT_QUESTION = "Which colours appear in this image, and how many separate shapes are drawn on it?"
BLOCK_SIZE = 32
#: vlmcache's CPU tier per test engine (a /dev/shm region of this size; CI has 24 GiB).
TEST_MEMORY_BUDGET = 256 * 1024**2
MAX_TOKENS = 8


def engine_args(seed: int = 0) -> dict[str, Any]:
    """vLLM settings that work on this project's 2-core CPU machines."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    return {"gpu_memory_utilization": 0.3, "max_model_len": 1024, "enforce_eager": True,
            "seed": seed, "block_size": BLOCK_SIZE}


def make_request(seed: int, question: str = QUESTION, tenant: str | None = None) -> Any:
    """The request for test image ``seed``."""
    from vlmcache.api import VlmRequest

    return VlmRequest(TINY_LLAVA_PROMPT.format(question=question), (make_test_image(seed),),
                      tenant)


def greedy(max_tokens: int = MAX_TOKENS) -> Any:
    from vllm import SamplingParams

    return SamplingParams(max_tokens=max_tokens, temperature=0.0)


def run(mode: str, model: str, store: str, seeds: Sequence[int],
        alt_seeds: Sequence[int] = ()) -> list[dict[str, Any]]:
    """Answer each seed's request (``alt_seeds``: with :data:`ALT_QUESTION`) in one engine;
    ``mode`` is ``cache`` or ``off``."""
    from vlmcache.api import CachedLLM
    from vlmcache.config import VlmCacheConfig

    # each prompt is asked once and what it stored is checked: captured at first sight
    config = VlmCacheConfig(store_path=store, block_size=BLOCK_SIZE, disk_write="sync",
                            memory_budget=TEST_MEMORY_BUDGET, admission_memory="always")
    llm = CachedLLM(model, config, enabled=mode == "cache", engine_args=engine_args())
    results = []
    try:
        jobs = [(seed, QUESTION) for seed in seeds] + [(s, ALT_QUESTION) for s in alt_seeds]
        for seed, question in jobs:
            out = llm.generate([make_request(seed, question)], greedy())[0]
            results.append({"seed": seed, "alt": question == ALT_QUESTION,
                            "token_ids": out.token_ids, "report": out.report.to_dict()})
    finally:
        llm.close()
    return results


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mode", choices=("cache", "off"), required=True)
    parser.add_argument("--model", required=True)
    parser.add_argument("--store", required=True)
    parser.add_argument("--seeds", type=int, nargs="+", required=True)
    parser.add_argument("--alt-seeds", type=int, nargs="*", default=[])
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    results = run(args.mode, args.model, args.store, args.seeds, args.alt_seeds)
    Path(args.out).write_text(json.dumps(results))


if __name__ == "__main__":
    main()
