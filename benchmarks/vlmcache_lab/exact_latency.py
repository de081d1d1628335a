"""Cache-off vs cache-miss (capture on) vs persisted-hit latency, side by side in one run.

Each mode runs in its own engine process on the same requests (batch 1): ``cache_off`` is
plain vLLM, ``miss_capture`` is vlmcache on an empty store (every request computed and
saved), ``persisted_hit`` is a *new* process on the store the previous mode filled (every
request's prompt KV loaded from disk). Prints the medians and their ratios and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from vlmcache_lab import child_env

MODES = ("cache_off", "miss_capture", "persisted_hit")
WARMUP_SEED = 10_000


def _model_params(size: str) -> dict[str, int]:
    if size == "tiny":
        return {}
    # SmolLM2-135M's language-model geometry (random weights): prefill costs real compute
    return {"text_hidden": 576, "text_layers": 30, "text_heads": 9, "text_kv_heads": 3,
            "text_intermediate": 1536}


def run_mode(mode: str, model: str, store: str, n: int, max_tokens: int) -> dict[str, Any]:
    """One mode in this process: a warm-up request, then ``n`` timed requests."""
    from vlmcache.api import CachedLLM
    from vlmcache.config import VlmCacheConfig
    from vlmcache.testing.engine_job import (
        BLOCK_SIZE,
        engine_args,
        greedy,
        make_request,
    )

    config = VlmCacheConfig(store_path=store, block_size=BLOCK_SIZE, log_requests=False)
    llm = CachedLLM(model, config, enabled=mode != "cache_off", engine_args=engine_args())
    params = greedy(max_tokens)
    try:
        llm.generate([make_request(WARMUP_SEED + MODES.index(mode))], params)
        rows = []
        for seed in range(n):
            start = time.perf_counter()
            out = llm.generate([make_request(seed)], params)[0]
            rows.append({"seed": seed, "ms": (time.perf_counter() - start) * 1e3,
                         "prompt_tokens": out.report.prompt_tokens,
                         "tokens_loaded": out.report.tokens_loaded,
                         "token_ids": out.token_ids})
    finally:
        llm.close()
    return {"mode": mode, "rows": rows}


def _run_child(mode: str, model: str, store: str, n: int, max_tokens: int, out: Path) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "vlmcache_lab.exact_latency", "--child", mode,
           "--model", model, "--store", store, "--n", str(n), "--max-tokens", str(max_tokens),
           "--child-out", str(out)]
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, env=child_env())
    return json.loads(out.read_text())


def summarize(results: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Medians per mode, ratios to cache-off, and whether every mode agreed on the tokens."""
    med = {m: statistics.median(r["ms"] for r in results[m]["rows"]) for m in MODES}
    base = results["cache_off"]["rows"]
    hit = results["persisted_hit"]["rows"]
    same = all(a["token_ids"] == b["token_ids"] for m in MODES[1:]
               for a, b in zip(base, results[m]["rows"]))
    return {
        "cache_off_ms": round(med["cache_off"], 2),
        "miss_capture_ms": round(med["miss_capture"], 2),
        "persisted_hit_ms": round(med["persisted_hit"], 2),
        "miss_capture_over_cache_off": round(med["miss_capture"] / med["cache_off"], 3),
        "persisted_hit_over_cache_off": round(med["persisted_hit"] / med["cache_off"], 3),
        "prompt_tokens": base[0]["prompt_tokens"],
        "persisted_hit_tokens_loaded_median": statistics.median(r["tokens_loaded"] for r in hit),
        "same_tokens_in_all_modes": same,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=16, help="timed requests per mode")
    parser.add_argument("--max-tokens", type=int, default=1)
    parser.add_argument("--model-size", choices=("tiny", "smollm"), default="tiny")
    parser.add_argument("--out", default="benchmarks/results/cpu-exact.json")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--store", help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = run_mode(args.child, args.model, args.store, args.n, args.max_tokens)
        Path(args.child_out).write_text(json.dumps(result))
        return
    _run_all(args, argv)


def _run_all(args: argparse.Namespace, argv: Sequence[str] | None) -> None:
    from vlmcache.testing.tiny_llava import build_tiny_llava

    work = Path(tempfile.mkdtemp(prefix="vlmcache-bench-"))
    model = str(build_tiny_llava(work / "model", **_model_params(args.model_size)))
    store = str(work / "store")
    results = {m: _run_child(m, model, store, args.n, args.max_tokens, work / f"{m}.json")
               for m in MODES}
    summary = summarize(results)
    import vllm

    record = {"command": "python " + " ".join(
                  ["benchmarks/cpu_exact.py", *map(shlex.quote, sys.argv[1:] if argv is None else argv)]),
              "device": f"CPU: {platform.processor() or platform.machine()}, "
                        f"{_cpu_count()} cores", "vllm_version": vllm.__version__,
              "model": f"tiny LLaVA ({args.model_size}), random weights",
              "n_requests_per_mode": args.n, "max_tokens": args.max_tokens,
              "batch_size": 1, **summary}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    _print_table(record)


def _cpu_count() -> int:
    import os

    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 0


def _print_table(r: dict[str, Any]) -> None:
    print(f"{'mode':<16}{'median ms':>12}{'x cache-off':>14}")
    print(f"{'cache_off':<16}{r['cache_off_ms']:>12.2f}{1.0:>14.3f}")
    print(f"{'miss_capture':<16}{r['miss_capture_ms']:>12.2f}"
          f"{r['miss_capture_over_cache_off']:>14.3f}")
    print(f"{'persisted_hit':<16}{r['persisted_hit_ms']:>12.2f}"
          f"{r['persisted_hit_over_cache_off']:>14.3f}")
    print(f"prompt tokens {r['prompt_tokens']}, loaded on hit "
          f"{r['persisted_hit_tokens_loaded_median']}, same tokens in all modes: "
          f"{r['same_tokens_in_all_modes']}")


if __name__ == "__main__":
    main()
