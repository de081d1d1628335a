"""Prefill latency and throughput of every reuse path, side by side, on one GPU.

For one model geometry (``benchmarks/geometries/``: real 7B shapes, dummy weights), each
mode runs in its own engine process on the same requests (~620-token image prompts, one
output token):

- ``vllm``: vLLM alone (prefix caching on): recompute, GPU prefix-cache hit, batched
  prefill throughput;
- ``native_offload``: vLLM's own CPU offloading (``kv_offloading_size``): its capture cost
  and its CPU hit after the GPU prefix cache was reset;
- ``vlmcache``: vlmcache's KV connector: capture cost (all misses), GPU hit, CPU-tier hit
  after the GPU prefix cache was reset, batched;
- ``vlmcache_memory``: the same with the disk tier off (``disk_budget=0``), which shows
  what the disk write-behind costs the engine process;
- ``vlmcache_disk``: a new engine process on the store ``vlmcache`` filled: disk-tier hits.

Batch 1 is timed one request at a time (wall clock around ``generate``); batched runs
send ``--batch`` requests in one ``generate`` call. Results: JSON and Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

MODES = ("vllm", "native_offload", "vlmcache", "vlmcache_memory", "vlmcache_disk")
WARMUP_SEEDS = (9000, 9001, 9002)
BATCH_SEED0 = 100
QUESTION = ("Describe the scene in this picture in detail: the objects, their colours and "
            "positions, and any text that can be read in it.")


def _prompt(geometry: Path) -> tuple[str, int]:
    """(prompt, image side in pixels) for the geometry's model family."""
    cfg = json.loads((geometry / "config.json").read_text())
    if cfg.get("model_type") == "qwen2_vl":
        return ("<|im_start|>user\n<|vision_start|><|image_pad|><|vision_end|>"
                f"{QUESTION}<|im_end|>\n<|im_start|>assistant\n", 672)
    return f"USER: <image>\n{QUESTION} ASSISTANT:", 336


def _image(seed: int, side: int) -> Any:
    import numpy as np
    from PIL import Image

    rng = np.random.default_rng(seed)
    return Image.fromarray(rng.integers(0, 256, (side, side, 3), dtype=np.uint8))


def _engine_args(args: argparse.Namespace) -> dict[str, Any]:
    return {"load_format": "dummy", "enforce_eager": not args.compile,
            "gpu_memory_utilization": args.gpu_memory_utilization,
            "max_model_len": args.max_model_len,
            "limit_mm_per_prompt": {"image": 1}, "seed": 0, "max_num_seqs": 64,
            "enable_prefix_caching": True}


class Runner:
    """One engine in this process: plain vLLM or vlmcache's ``CachedLLM``."""

    def __init__(self, mode: str, args: argparse.Namespace) -> None:
        from vllm import SamplingParams

        self.mode = mode
        self.prompt, self.side = _prompt(Path(args.geometry))
        self.params = SamplingParams(temperature=0.0, max_tokens=1)
        engine_args = _engine_args(args)
        self.cached = None
        if mode.startswith("vlmcache"):
            from vlmcache.api import CachedLLM
            from vlmcache.config import VlmCacheConfig

            store = args.store + ("-memory" if mode == "vlmcache_memory" else "")
            config = VlmCacheConfig(store_path=store, memory_budget=args.cpu_bytes,
                                    disk_budget=0 if mode == "vlmcache_memory" else 50 * 1024**3,
                                    enable_encoder_cache=False, log_requests=False,
                                    model_revision="dummy-weights")
            self.cached = CachedLLM(args.geometry, config, engine_args=engine_args)
            self.llm = self.cached.llm
        else:
            from vllm import LLM

            if mode == "native_offload":
                engine_args["kv_offloading_size"] = args.cpu_bytes / 1024**3
            self.llm = LLM(model=args.geometry, **engine_args)

    def generate(self, seeds: Sequence[int]) -> list[dict[str, Any]]:
        """One ``generate`` call over ``seeds``' requests; per-request facts."""
        images = [_image(s, self.side) for s in seeds]
        if self.cached is not None:
            from vlmcache.api import VlmRequest

            outs = self.cached.generate([VlmRequest(self.prompt, (im,)) for im in images],
                                        self.params)
            return [{"prompt_tokens": o.report.prompt_tokens,
                     "tokens_loaded": o.report.tokens_loaded,
                     "gpu_cached": o.report.tokens_from_prefix_cache} for o in outs]
        prompts = [{"prompt": self.prompt, "multi_modal_data": {"image": im}} for im in images]
        outs = self.llm.generate(prompts, self.params, use_tqdm=False)
        return [{"prompt_tokens": len(o.prompt_token_ids or ()),
                 "tokens_loaded": 0, "gpu_cached": o.num_cached_tokens or 0} for o in outs]

    def timed(self, seeds: Sequence[int]) -> dict[str, Any]:
        """Batch 1: each request alone; median latency and what was reused."""
        ms, facts = [], []
        for s in seeds:
            start = time.perf_counter()
            facts += self.generate([s])
            ms.append((time.perf_counter() - start) * 1e3)
        return {"median_ms": round(statistics.median(ms), 2),
                "min_ms": round(min(ms), 2), "all_ms": [round(m, 2) for m in ms],
                "prompt_tokens": facts[0]["prompt_tokens"],
                "cached_tokens_median": statistics.median(
                    f["gpu_cached"] + f["tokens_loaded"] for f in facts),
                "loaded_tokens_median": statistics.median(f["tokens_loaded"] for f in facts)}

    def batched(self, seeds: Sequence[int]) -> dict[str, Any]:
        """All ``seeds`` in one call: prompt tokens per second."""
        start = time.perf_counter()
        facts = self.generate(seeds)
        wall = time.perf_counter() - start
        tokens = sum(f["prompt_tokens"] for f in facts)
        return {"batch": len(seeds), "wall_ms": round(wall * 1e3, 1),
                "prompt_tok_s": round(tokens / wall), "loaded_tokens": sum(
                    f["tokens_loaded"] for f in facts),
                "cached_tokens": sum(f["gpu_cached"] + f["tokens_loaded"] for f in facts)}

    def reset_gpu_cache(self, settle_s: float) -> None:
        """Let asynchronous saves land, then drop vLLM's GPU prefix cache."""
        time.sleep(settle_s)
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache")

    def close(self) -> None:
        if self.cached is not None:
            self.cached.close()


def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement of one mode, in this process."""
    runner = Runner(mode, args)
    seeds = list(range(args.n))
    batch = list(range(BATCH_SEED0, BATCH_SEED0 + args.batch))
    out: dict[str, Any] = {}
    try:
        runner.generate(list(WARMUP_SEEDS))
        runner.batched([s + 50_000 for s in batch])  # warms the batched shapes
        if mode == "vlmcache_disk":
            out["disk_hit"] = runner.timed(seeds)
            out["disk_hit_batch"] = runner.batched(batch)
            return out
        out["miss"] = runner.timed(seeds)
        time.sleep(args.settle)  # asynchronous saves land before the next phase
        out["gpu_hit"] = runner.timed(seeds)
        out["miss_batch"] = runner.batched(batch)
        runner.reset_gpu_cache(args.settle)
        out["after_reset"] = runner.timed(seeds)
        out["after_reset_batch"] = runner.batched(batch)
    finally:
        runner.close()
    return out


def _run_child(mode: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    out = work / f"{mode}.json"
    cmd = [sys.executable, "-m", "vlmcache.bench.gpu_latency", "--child", mode,
           "--child-out", str(out), *_forwarded(args)]
    start = time.time()
    try:
        proc = subprocess.run(cmd, timeout=args.mode_timeout, capture_output=True, text=True)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {args.mode_timeout} s"}
    if proc.returncode != 0 or not out.exists():
        tail = (proc.stderr or proc.stdout)[-3000:]
        return {"error": f"exit {proc.returncode}", "log_tail": tail}
    result = json.loads(out.read_text())
    result["process_s"] = round(time.time() - start, 1)
    return result


def _forwarded(args: argparse.Namespace) -> list[str]:
    flags = ["--geometry", args.geometry, "--store", args.store, "--n", str(args.n),
             "--batch", str(args.batch), "--cpu-bytes", str(args.cpu_bytes),
             "--settle", str(args.settle),
             "--gpu-memory-utilization", str(args.gpu_memory_utilization),
             "--max-model-len", str(args.max_model_len)]
    return flags + (["--compile"] if args.compile else [])


def headline(modes: dict[str, dict[str, Any]]) -> dict[str, float | None]:
    """The figures the targets are judged on (None where a mode failed)."""
    def get(mode: str, phase: str, key: str = "median_ms") -> float | None:
        value = modes.get(mode, {}).get(phase, {})
        return value.get(key) if isinstance(value, dict) else None

    return {"recompute_ms": get("vllm", "miss"), "gpu_hit_ms": get("vllm", "gpu_hit"),
            "native_offload_hit_ms": get("native_offload", "after_reset"),
            "native_offload_miss_ms": get("native_offload", "miss"),
            "vlmcache_cpu_hit_ms": get("vlmcache", "after_reset"),
            "vlmcache_gpu_hit_ms": get("vlmcache", "gpu_hit"),
            "memory_only_cpu_hit_ms": get("vlmcache_memory", "after_reset"),
            "memory_only_gpu_hit_ms": get("vlmcache_memory", "gpu_hit"),
            "memory_only_capture_miss_ms": get("vlmcache_memory", "miss"),
            "memory_only_capture_batch_tok_s": get("vlmcache_memory", "miss_batch",
                                                   "prompt_tok_s"),
            "vlmcache_disk_hit_ms": get("vlmcache_disk", "disk_hit"),
            "capture_miss_ms": get("vlmcache", "miss"),
            "nocache_batch_tok_s": get("vllm", "miss_batch", "prompt_tok_s"),
            "capture_batch_tok_s": get("vlmcache", "miss_batch", "prompt_tok_s"),
            "native_capture_batch_tok_s": get("native_offload", "miss_batch", "prompt_tok_s"),
            "native_offload_hit_batch_tok_s": get("native_offload", "after_reset_batch",
                                                  "prompt_tok_s"),
            "vlmcache_cpu_hit_batch_tok_s": get("vlmcache", "after_reset_batch",
                                                "prompt_tok_s"),
            "vlmcache_disk_hit_batch_tok_s": get("vlmcache_disk", "disk_hit_batch",
                                                 "prompt_tok_s")}


def markdown(record: dict[str, Any]) -> str:
    """The run as a Markdown table (medians, batch 1; throughput batched)."""
    h = record["headline"]
    rec = h.get("recompute_ms")
    lines = [f"# GPU latency: {record['geometry']}", "",
             f"- command: `{record['command']}`", f"- device: {record['device']}",
             f"- vLLM {record['vllm_version']}, {record['engine']}", "",
             "| path | batch-1 median ms | x recompute | batched prompt tok/s |",
             "|---|---|---|---|"]
    rows = (("recompute (vLLM, miss)", "recompute_ms", "nocache_batch_tok_s"),
            ("vLLM GPU prefix-cache hit", "gpu_hit_ms", None),
            ("vLLM native CPU offload: miss (capture)", "native_offload_miss_ms",
             "native_capture_batch_tok_s"),
            ("vLLM native CPU offload: hit", "native_offload_hit_ms",
             "native_offload_hit_batch_tok_s"),
            ("vlmcache: miss (capture on)", "capture_miss_ms", "capture_batch_tok_s"),
            ("vlmcache: GPU hit", "vlmcache_gpu_hit_ms", None),
            ("vlmcache: CPU-tier hit", "vlmcache_cpu_hit_ms", "vlmcache_cpu_hit_batch_tok_s"),
            ("vlmcache, disk tier off: miss (capture on)", "memory_only_capture_miss_ms",
             "memory_only_capture_batch_tok_s"),
            ("vlmcache, disk tier off: GPU hit", "memory_only_gpu_hit_ms", None),
            ("vlmcache, disk tier off: CPU-tier hit", "memory_only_cpu_hit_ms", None),
            ("vlmcache: disk-tier hit (new process)", "vlmcache_disk_hit_ms",
             "vlmcache_disk_hit_batch_tok_s"))
    for name, ms_key, tput_key in rows:
        ms, tput = h.get(ms_key), h.get(tput_key) if tput_key else None
        ratio = f"{ms / rec:.2f}" if ms is not None and rec else ""
        lines.append(f"| {name} | {_fmt(ms)} | {ratio} | {_fmt(tput)} |")
    errors = {m: r["error"] for m, r in record["modes"].items() if "error" in r}
    lines += [""] + [f"- mode `{m}` failed: {e}" for m, e in errors.items()]
    return "\n".join(lines) + "\n"


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else (f"{value:.2f}" if value < 1000 else f"{value:,.0f}")


def _device() -> str:
    try:
        import torch

        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    except Exception:  # noqa: BLE001 - only a label
        name = "unknown"
    return f"{name}; {platform.node()}; {os.cpu_count()} CPU cores"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--geometry", default="benchmarks/geometries/llava7b")
    parser.add_argument("--n", type=int, default=12, help="batch-1 requests per phase")
    parser.add_argument("--batch", type=int, default=32, help="requests in a batched call")
    parser.add_argument("--cpu-bytes", type=int, default=24 * 1024**3,
                        help="CPU cache size for native offloading and vlmcache's memory tier")
    parser.add_argument("--settle", type=float, default=2.0,
                        help="seconds for asynchronous saves before the GPU cache is reset")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--compile", action="store_true", help="torch.compile + CUDA graphs")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--mode-timeout", type=int, default=400)
    parser.add_argument("--out", default="benchmarks/results/gpu-latency.json")
    parser.add_argument("--store", default="")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        Path(args.child_out).write_text(json.dumps(run_mode(args.child, args)))
        return
    work = Path(tempfile.mkdtemp(prefix="vlmcache-gpu-"))
    args.store = args.store or str(work / "store")
    print(f"modes {args.modes}; work dir {work}", flush=True)
    modes: dict[str, dict[str, Any]] = {}
    for mode in args.modes.split(","):
        modes[mode] = _run_child(mode, args, work)
        print(mode, json.dumps(modes[mode])[-3000:], flush=True)
        _write(args, argv, modes)  # after each mode: a run cut short keeps what it measured
    print(Path(args.out).with_suffix(".md").read_text())


def _write(args: argparse.Namespace, argv: Sequence[str] | None,
           modes: dict[str, dict[str, Any]]) -> None:
    import vllm

    cmd = "python benchmarks/gpu_latency.py " + shlex.join(
        list(argv) if argv is not None else sys.argv[1:])
    record = {"command": cmd.strip(), "device": _device(), "vllm_version": vllm.__version__,
              "geometry": Path(args.geometry).name, "dummy_weights": True,
              "engine": "enforce_eager" if not args.compile else "compiled + CUDA graphs",
              "output_tokens": 1, "n_batch1": args.n, "batch": args.batch,
              "cpu_cache_bytes": args.cpu_bytes, "headline": headline(modes), "modes": modes}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")
    out.with_suffix(".md").write_text(markdown(record))


if __name__ == "__main__":
    main()
