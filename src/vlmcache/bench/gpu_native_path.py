"""vlmcache's KV path against vLLM's own paths, side by side on one GPU, per model shape.

Modes (each in its own engine process, same requests: ~620-680-token image prompts, one
output token, dummy weights, ``benchmarks/geometries/``; vLLM's default engine, compiled with
CUDA graphs, unless ``--eager``):

- ``vllm``: recompute (miss), vLLM's GPU prefix-cache hit (twice: ``gpu_hit_again``),
  batched prefill throughput;
- ``native_cpu``: vLLM's native CPU offloading (``kv_offloading_size``): CPU hit after the
  GPU prefix cache is reset;
- ``native_tiering`` / ``native_tiering_restart``: vLLM's ``OffloadingConnector`` with its
  ``TieringOffloadingSpec`` (CPU + its ``fs`` tier): capture, CPU hit; then a new process
  reading its fs tier;
- ``vlmcache`` / ``vlmcache_restart``: ``CachedLLM`` on vlmcache's KV path (vLLM's
  offloading connector + vlmcache's persistent tier and cost model): capture (miss), GPU
  hit, CPU hit, batched; then a new process on the same store. ``vlmcache@second_sight``
  (and ``vlmcache_restart@second_sight``) run them with another ``admission_memory`` than
  ``--admission-memory``, on a store of their own, recorded beside the default's rows.

``MODE#k`` runs a mode again in another engine process (on a store of its own; a restart
mode shares its capture mode's): the summary pools every run's requests, keeps each run's
median, and judges a full load on the worst run.

Every row says what was reused: tokens loaded, from vLLM's prefix cache, computed. One mode
failing records its error and the others go on; results are rewritten after every mode.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from vlmcache.bench.gpu_native_summary import BASELINES, merge_files, merge_shape
from vlmcache.bench.mode_procs import kill_running, run_child
from vlmcache.bench.phase_timing import PHASES, PhaseProfile, phase_medians, phases
from vlmcache.config import VlmCacheConfig

MODES = ("vllm", "vlmcache", "vlmcache_restart", "native_cpu", "native_tiering",
         "native_tiering_restart", "vllm_repeat")
#: diagnostic, not judged: vLLM's tiering spec with its CPU tier alone (what vlmcache's
#: spec adds its persistent tier to)
DIAGNOSTIC_MODES = ("native_tiering_cpu",)
WARMUP_SEEDS = (9000, 9001, 9002)
BATCH_SEED0 = 100
AGAIN_SEED_OFFSET = 20_000
ADMISSIONS = ("always", "second_sight")
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


def _device() -> str:
    try:
        import torch

        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    except Exception:  # noqa: BLE001 - only a label
        name = "unknown"
    return f"{name}; {platform.node()}; {os.cpu_count()} CPU cores"


def _engine_args(args: argparse.Namespace) -> dict[str, Any]:
    return {"load_format": "dummy", "enforce_eager": args.eager,
            "gpu_memory_utilization": args.gpu_memory_utilization,
            "max_model_len": args.max_model_len, "limit_mm_per_prompt": {"image": 1},
            "seed": 0, "max_num_seqs": 64, "enable_prefix_caching": True,
            "block_size": args.block_size,
            "disable_log_stats": False}  # per-request engine timestamps (where time goes)


def _vlmcache_llm(args: argparse.Namespace, engine_args: dict[str, Any]) -> Any:
    from vlmcache.api import CachedLLM
    from vlmcache.config import VlmCacheConfig

    config = VlmCacheConfig(store_path=args.store, memory_budget=args.cpu_bytes,
                            disk_budget=args.disk_bytes, enable_encoder_cache=False,
                            enable_exact=False, log_requests=False,
                            model_revision="dummy-weights", kv_io_threads=args.kv_io_threads,
                            admission_memory=args.admission_memory)
    return CachedLLM(args.geometry, config, engine_args=engine_args)


def _native_llm(mode: str, args: argparse.Namespace, engine_args: dict[str, Any]) -> Any:
    from vllm import LLM

    if mode == "native_cpu":
        engine_args["kv_offloading_size"] = args.cpu_bytes / 1024**3
    elif mode.startswith("native_tiering"):
        from vllm.config import KVTransferConfig

        tiers = ([] if mode == "native_tiering_cpu" else
                 [{"type": "fs", "root_dir": args.store + "-fs"}])
        extra = {"spec_name": "TieringOffloadingSpec", "cpu_bytes_to_use": args.cpu_bytes,
                 "secondary_tiers": tiers}
        engine_args["kv_transfer_config"] = KVTransferConfig(
            kv_connector="OffloadingConnector", kv_role="kv_both",
            kv_connector_extra_config=extra)
        engine_args["prefix_caching_hash_algo"] = "sha256_cbor"
    return LLM(model=args.geometry, **engine_args)


class Runner:
    """One engine in this process."""

    def __init__(self, mode: str, args: argparse.Namespace) -> None:
        from vllm import SamplingParams

        self.prompt, self.side = _prompt(Path(args.geometry))
        self.store, self.block_size = args.store, args.block_size
        self.params = SamplingParams(temperature=0.0, max_tokens=1)
        self.params2 = SamplingParams(temperature=0.0, max_tokens=2)
        engine_args = _engine_args(args)
        self.cached = _vlmcache_llm(args, engine_args) if mode.startswith("vlmcache") else None
        if self.cached is not None:  # the geometries carry no tokenizer_config to read it from
            self.cached.image_placeholder = ("<|image_pad|>" if "<|image_pad|>" in self.prompt
                                             else "<image>")
        self.llm = self.cached.llm if self.cached else _native_llm(mode, args, engine_args)

    def generate(self, seeds: Sequence[int], params: Any = None) -> list[dict[str, Any]]:
        """One ``generate`` call; per request: prompt tokens, loaded, from prefix cache, where
        its time went, and the call's wall time (``wall_s``: the call alone, not making the
        images nor the benchmark's own look at the store)."""
        images = [_image(s, self.side) for s in seeds]
        params = params or self.params
        start = time.perf_counter()
        if self.cached is not None:
            from vlmcache.api import VlmRequest

            outs = self.cached.generate([VlmRequest(self.prompt, (im,)) for im in images],
                                        params)
            end = time.perf_counter()
            return [{"wall_s": end - start,
                     "prompt": o.report.prompt_tokens, "loaded": o.report.tokens_loaded,
                     "prefix": o.report.tokens_from_prefix_cache,
                     "stored": self._stored_tokens(o.report.chunk_keys),
                     "choice": o.report.kv_cost_choice, "reason": o.report.kv_cost_reason,
                     **phases(o.output, start, end)} for o in outs]
        prompts = [{"prompt": self.prompt, "multi_modal_data": {"image": im}} for im in images]
        outs = self.llm.generate(prompts, params, use_tqdm=False)
        end = time.perf_counter()
        # vLLM reports one number for its prefix cache plus what a connector loaded
        return [{"wall_s": end - start,
                 "prompt": len(o.prompt_token_ids or ()), "cached": o.num_cached_tokens or 0,
                 **phases(o, start, end)} for o in outs]

    def _stored_tokens(self, chunk_keys: Sequence[str]) -> int:
        """Tokens of the request's leading chunks found in the persistent store's files."""
        from vlmcache.store.chunkfile import SUFFIX

        root = Path(self.store) / "kv" / "chunks"
        stored = 0
        for key in chunk_keys:
            if not (root / key[:2] / f"{key}{SUFFIX}").exists():
                break
            stored += 1
        return stored * self.block_size

    def timed(self, seeds: Sequence[int]) -> dict[str, Any]:
        """Batch 1: each request alone; median latency and what was reused."""
        ms, facts = [], []
        for s in seeds:
            facts += self.generate([s])
            ms.append(facts[-1]["wall_s"] * 1e3)
        return {"median_ms": round(statistics.median(ms), 2), "min_ms": round(min(ms), 2),
                "all_ms": [round(m, 2) for m in ms], **_token_summary(facts),
                "phases_ms": [{k: round(f[k], 2) for k in PHASES if k in f} for f in facts]}

    def batched(self, seeds: Sequence[int]) -> dict[str, Any]:
        facts = self.generate(seeds)
        wall = facts[0]["wall_s"]
        tokens = sum(f["prompt"] for f in facts)
        return {"batch": len(seeds), "wall_ms": round(wall * 1e3, 1),
                "prompt_tok_s": round(tokens / wall), **_token_summary(facts)}

    def reset_gpu_cache(self, settle_s: float) -> None:
        time.sleep(settle_s)  # asynchronous stores land first
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("vLLM refused to reset its prefix cache")

    def close(self) -> None:
        if self.cached is not None:
            self.cached.close()


def _token_summary(facts: list[dict[str, Any]]) -> dict[str, Any]:
    """Median tokens per request: prompt, loaded, from prefix cache, computed; and the
    median time per phase."""
    def med(fn: Any) -> float:
        return statistics.median(fn(f) for f in facts)

    if "cached" in facts[0]:  # plain vLLM: loaded and prefix-cached are one number
        out = {"prompt_tokens": med(lambda f: f["prompt"]),
               "tokens_cached": med(lambda f: f["cached"]),
               "tokens_computed": med(lambda f: f["prompt"] - f["cached"])}
        return {**out, **phase_medians(facts)}
    choices = sorted({str(f["choice"]) for f in facts if f["choice"]})
    return {"prompt_tokens": med(lambda f: f["prompt"]),
            "tokens_loaded": med(lambda f: f["loaded"]),
            "tokens_from_prefix_cache": med(lambda f: f["prefix"]),
            "tokens_computed": med(lambda f: f["prompt"] - f["loaded"] - f["prefix"]),
            "tokens_stored": med(lambda f: f["stored"]),
            "cost_model_choices": choices,
            "cost_model_reason": next((f["reason"] for f in facts if f["reason"]), None),
            **phase_medians(facts)}


def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement of one mode, in this process."""
    runner = Runner(mode, args)
    seeds, batch = list(range(args.n)), list(range(BATCH_SEED0, BATCH_SEED0 + args.batch))
    out: dict[str, Any] = {}
    try:
        runner.batched([s + 50_000 for s in batch])  # warms the batched shapes
        runner.generate(list(WARMUP_SEEDS))
        for s in WARMUP_SEEDS:  # single prefills (2 tokens: the engine times its prefill)
            runner.generate([s + 1000], runner.params2)
        if mode.endswith("_restart"):
            with PhaseProfile(args, f"{mode}-restart_hit"):
                out["restart_hit"] = runner.timed(seeds)
            out["restart_hit_batch"] = runner.batched(batch)
            return out
        with PhaseProfile(args, f"{mode}-miss"):
            out["miss"] = runner.timed(seeds)
        time.sleep(args.settle)
        with PhaseProfile(args, f"{mode}-gpu_hit"):
            out["gpu_hit"] = runner.timed(seeds)
        time.sleep(args.settle)
        # a prompt's later GPU hits: its first one may have captured it (second sight)
        out["gpu_hit_again"] = runner.timed(seeds)
        out["miss_batch"] = runner.batched(batch)
        if mode not in BASELINES:
            _offload_phases(runner, mode, args, seeds, batch, out)
        time.sleep(args.settle)  # the persistent tier's writes land before the process ends
    finally:
        runner.close()
    return out


def _offload_phases(runner: Runner, mode: str, args: argparse.Namespace,
                    seeds: Sequence[int], batch: Sequence[int], out: dict[str, Any]) -> None:
    """CPU-tier hits, each timed right after its prompts were captured (the CPU region holds
    ~60 LLaVA prompts: LRU would evict them to make room for later captures). Under second
    sight a prompt is captured when computed a second time (its GPU hit captures it only
    where the persistent tier would keep it): other prompts are computed once, evicted from
    the GPU and timed computed again (``miss_again``), then hit in the CPU tier."""
    hit_seeds = list(seeds)
    second_sight = mode.startswith("vlmcache") and args.admission_memory == "second_sight"
    if second_sight:
        hit_seeds = [s + AGAIN_SEED_OFFSET for s in seeds]
        runner.generate(hit_seeds)
        runner.reset_gpu_cache(args.settle)
        out["miss_again"] = runner.timed(hit_seeds)
    runner.reset_gpu_cache(args.settle)
    with PhaseProfile(args, f"{mode}-cpu_hit"):
        out["cpu_hit"] = runner.timed(hit_seeds)
    if second_sight:  # the batch's first computation was miss_batch
        out["miss_again_batch"] = runner.batched(batch)
    runner.reset_gpu_cache(args.settle)
    out["cpu_hit_batch"] = runner.batched(batch)


def _mode(name: str) -> str:
    """A mode, a vlmcache mode with another admission (``vlmcache@second_sight``), either
    repeated in another engine process on a store of its own (``vllm#2``)."""
    spec, mark, repeat = name.partition("#")
    base, at, admission = spec.partition("@")
    if base not in MODES + DIAGNOSTIC_MODES:
        raise argparse.ArgumentTypeError(
            f"unknown mode {base!r}: one of {', '.join(MODES + DIAGNOSTIC_MODES)}")
    if at and (not base.startswith("vlmcache") or admission not in ADMISSIONS):
        raise argparse.ArgumentTypeError(
            f"{name!r}: only vlmcache modes take @admission, one of {', '.join(ADMISSIONS)}")
    if mark and not (repeat.isdigit() and int(repeat) >= 2):
        raise argparse.ArgumentTypeError(f"{name!r}: a repeat is #2, #3, ...")
    return name


def _child_args(name: str, args: argparse.Namespace) -> str:
    """The base mode a child runs; a variant's admission and a repeat's store set in
    ``args`` (a restart mode shares its capture mode's store: same admission and repeat)."""
    spec, _, repeat = name.partition("#")
    base, _, admission = spec.partition("@")
    if admission:
        args.admission_memory, args.store = admission, f"{args.store}-{admission}"
    if repeat:
        args.store = f"{args.store}-r{repeat}"
    return base


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--geometry", default="benchmarks/geometries/qwen2vl7b")
    parser.add_argument("--n", type=int, default=12, help="batch-1 requests per phase")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--cpu-bytes", type=int, default=24 * 1024**3)
    parser.add_argument("--disk-bytes", type=int, default=50 * 1024**3)
    parser.add_argument("--block-size", type=int, default=16, help="vLLM's KV block size")
    parser.add_argument("--settle", type=float, default=1.0)
    parser.add_argument("--kv-io-threads", type=int, default=8,
                        help="vlmcache's persistent-tier I/O threads")
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.85)
    parser.add_argument("--eager", action="store_true",
                        help="enforce_eager: no torch.compile, no CUDA graphs (vLLM's default, "
                        "and the benchmark's, is both)")
    parser.add_argument("--compile", action="store_true", help=argparse.SUPPRESS)  # the default
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--mode-timeout", type=int, default=240)
    parser.add_argument("--flush-timeout", type=int, default=180,
                        help="seconds a finished mode's I/O process may take to write out")
    parser.add_argument("--out", default="benchmarks/results/gpu-native-path.json")
    parser.add_argument("--profile-dir", default="",
                        help="py-spy collapsed stacks of the batch-1 phases (py-spy on PATH)")
    parser.add_argument("--store", default="")
    parser.add_argument("--work", default="")
    parser.add_argument("--child", type=_mode, help=argparse.SUPPRESS)
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    parser.add_argument("--admission-memory", default=VlmCacheConfig().admission_memory,
                        choices=ADMISSIONS,
                        help="vlmcache's admission to vLLM's CPU region (vlmcache modes)")
    parser.add_argument("--merge", nargs="+", metavar="FILE",
                        help="merge these result files into --out, and run nothing")
    args = parser.parse_args(argv)
    if args.merge:
        merge_files(args.merge, args.out)
        return
    modes_asked = [_mode(m) for m in args.modes.split(",")]
    if args.child:
        base = _child_args(args.child, args)
        Path(args.child_out).write_text(json.dumps(run_mode(base, args)))
        return
    args.work = args.work or tempfile.mkdtemp(prefix="vlmcache-native-")
    Path(args.work).mkdir(parents=True, exist_ok=True)
    args.store = args.store or str(Path(args.work) / "store")
    forwarded = [a for a in (argv if argv is not None else sys.argv[1:])]
    forwarded += ["--store", args.store, "--work", args.work]
    import signal

    signal.signal(signal.SIGTERM, kill_running)
    signal.signal(signal.SIGINT, kill_running)
    modes: dict[str, Any] = {}
    for mode in modes_asked:
        modes[mode] = run_child(mode, args, forwarded)
        print(mode, json.dumps(modes[mode])[-1500:], flush=True)
        _write(args, argv, modes)  # a run cut short keeps what it measured


def _write(args: argparse.Namespace, argv: Sequence[str] | None, modes: dict[str, Any]) -> None:
    import vllm

    out = Path(args.out)
    record = json.loads(out.read_text()) if out.exists() else {}
    cmd = "python benchmarks/gpu_native_path.py " + shlex.join(
        list(argv) if argv is not None else sys.argv[1:])
    record.update({"device": _device(), "vllm_version": vllm.__version__,
                   "engine": "enforce_eager" if args.eager else "compiled + CUDA graphs",
                   "dummy_weights": True, "output_tokens": 1})
    settings = {"n_batch1": args.n, "batch": args.batch, "cpu_bytes": args.cpu_bytes,
                "block_size": args.block_size, "admission_memory": args.admission_memory}
    merge_shape(record, Path(args.geometry).name, [cmd.strip()], modes, settings)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
