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

``A+B`` runs modes at once, sharing the GPU's memory, taking turns request by request
(:mod:`vlmcache_lab.turns`): run one after the other, engine processes on a lent H100 drew
the same GPU hit 15-30% apart, more than the targets allow. ``vllm+vlmcache,
native_cpu+native_tiering,vlmcache_restart+native_tiering_restart`` is the full set. Each
engine's work is in :mod:`vlmcache_lab.gpu_runner`.

Every row says what was reused: tokens loaded, from vLLM's prefix cache, computed. One mode
failing records its error and the others go on; results are rewritten after every mode.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence, get_args

from vlmcache_lab.gpu_native_summary import BASELINES, merge_files, merge_shape
from vlmcache_lab.gpu_runner import Runner
from vlmcache_lab.mode_procs import VARIANT_ENV, kill_running, run_group
from vlmcache_lab.phase_timing import PhaseProfile
from vlmcache_lab.proc_stats import busiest, minor_faults, session_cpu_s, thread_cpu_s
from vlmcache_lab.turns import Turns
from vlmcache.config import KvBlockLayout, VlmCacheConfig

MODES = ("vllm", "vlmcache", "vlmcache_restart", "native_cpu", "native_tiering",
         "native_tiering_restart", "vllm_repeat")
#: diagnostic, not judged: vLLM's tiering spec with its CPU tier alone (what vlmcache's
#: spec adds its persistent tier to); vlmcache's engine wiring driven as plain vLLM (no
#: front: what vlmcache's engine costs by itself); vlmcache with each request also sent as
#: plain vLLM to the same engine, right before or after it (rows under ``plain``); vlmcache's
#: engine, started by CachedLLM, sent plain vLLM requests only (is it the engine or the requests)
DIAGNOSTIC_MODES = ("native_tiering_cpu", "native_wired", "vlmcache_ab", "vlmcache_plain")
WARMUP_SEEDS = (9000, 9001, 9002)
BATCH_SEED0 = 100
#: seeds of the repeated first-sight batches (``miss_batch_2``, ...): other prompts each time
BATCH_REPEAT_OFFSET = 1_000
AGAIN_SEED_OFFSET = 20_000
ADMISSIONS = ("always", "second_sight")
#: ``vlmcache@memory``: CPU tier only (``disk_budget`` 0: no persistent tier, no I/O process);
#: ``vlmcache@per_layer`` / ``@cross_layer``: that ``kv_block_layout``; ``vlmcache@tight``:
#: its engine started without room on CPython's frame stack (``vllm/stack_room.py``)
LAYOUTS: tuple[str, ...] = get_args(KvBlockLayout)
VARIANTS = ADMISSIONS + ("memory", "tight") + LAYOUTS
#: any mode: its processes started with ``mode_procs.VARIANT_ENV`` (``vllm@hnd``,
#: ``vlmcache@malloc``)
ORDER_VARIANTS = tuple(VARIANT_ENV)


def _device() -> str:
    try:
        import torch

        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU"
    except Exception:  # noqa: BLE001 - only a label
        name = "unknown"
    return f"{name}; {platform.node()}; {os.cpu_count()} CPU cores"


def phase_plan(mode: str, args: argparse.Namespace) -> list[str]:
    """The timed phases ``run_mode`` runs for ``mode``, in order."""
    if mode.endswith("_restart"):
        return ["restart_hit", "restart_hit_batch"]
    plan = ["miss", "gpu_hit", "gpu_hit_again", "miss_batch"]
    repeats = [f"miss_batch_{k}" for k in range(2, args.batch_repeats + 1)]
    if mode in BASELINES:
        return plan + repeats
    if _second_sight(mode, args):
        return plan + ["miss_again", "cpu_hit", "miss_again_batch", "cpu_hit_batch"] + repeats
    return plan + ["cpu_hit", "cpu_hit_batch"] + repeats


def _second_sight(mode: str, args: argparse.Namespace) -> bool:
    return mode.startswith("vlmcache") and args.admission_memory == "second_sight"


def run_mode(mode: str, args: argparse.Namespace) -> dict[str, Any]:
    """Every measurement of one mode, in this process (taking turns on the GPU with the
    other modes of its group when ``args.turns`` names their turn server)."""
    turns = Turns(args.turns, args.child or mode, phase_plan(mode, args))
    runner = Runner(mode, args, turns)
    seeds, batch = list(range(args.n)), list(range(BATCH_SEED0, BATCH_SEED0 + args.batch))
    out: dict[str, Any] = {}

    def timed(name: str, seed_list: Sequence[int], batched: bool = False) -> None:
        turns.phase(name)
        threads0, faults0, held0 = thread_cpu_s(), minor_faults(), turns.held_s
        if batched:
            out[name] = runner.batched(seed_list)
        else:
            with PhaseProfile(args, f"{mode}-{name}", name):  # the batch-1 phases are profiled
                out[name] = runner.timed(seed_list)
        # CPU seconds of this mode's processes against the time it held the GPU: an engine
        # that spins between its turns uses far more
        threads = thread_cpu_s()
        out[name]["cpu_s"] = round(sum(threads.values()) - sum(threads0.values()), 2)
        out[name]["held_s"] = round(turns.held_s - held0, 2)
        out[name]["cpu_by_thread"] = busiest(threads0, threads)
        out[name]["minor_faults_by_process"] = busiest(faults0, minor_faults())

    try:
        runner.batched([s + 50_000 for s in batch])  # warms the batched shapes
        runner.generate(list(WARMUP_SEEDS))
        for s in WARMUP_SEEDS:  # single prefills (2 tokens: the engine times its prefill)
            runner.generate([s + 1000], runner.params2)
        if mode.endswith("_restart"):
            timed("restart_hit", seeds)
            timed("restart_hit_batch", batch, batched=True)
            return out
        timed("miss", seeds)
        time.sleep(args.settle)
        timed("gpu_hit", seeds)
        time.sleep(args.settle)
        # a prompt's later GPU hits: its first one may have captured it (second sight)
        timed("gpu_hit_again", seeds)
        timed("miss_batch", batch, batched=True)
        if mode not in BASELINES:
            _offload_phases(runner, mode, args, seeds, batch, timed)
        for k in range(2, args.batch_repeats + 1):  # last: a capture here evicts nothing timed
            timed(f"miss_batch_{k}", [s + k * BATCH_REPEAT_OFFSET for s in batch], batched=True)
        time.sleep(args.settle)  # the persistent tier's writes land before the process ends
    finally:
        runner.close()
        turns.close()
        if args.turns:  # an engine that spins while it waits slows the others
            out["turns_held_s"], out["session_cpu_s"] = round(turns.held_s, 1), session_cpu_s()
    return out


def _offload_phases(runner: Runner, mode: str, args: argparse.Namespace,
                    seeds: Sequence[int], batch: Sequence[int], timed: Any) -> None:
    """CPU-tier hits, each timed right after its prompts were captured (the CPU region holds
    ~60 LLaVA prompts: LRU would evict them to make room for later captures). Under second
    sight a prompt is captured when computed a second time (its GPU hit captures it only
    where the persistent tier would keep it): other prompts are computed once, evicted from
    the GPU and timed computed again (``miss_again``), then hit in the CPU tier."""
    hit_seeds = list(seeds)
    second_sight = _second_sight(mode, args)
    if second_sight:
        hit_seeds = [s + AGAIN_SEED_OFFSET for s in seeds]
        runner.generate(hit_seeds)
        runner.reset_gpu_cache(args.settle)
        timed("miss_again", hit_seeds)
    runner.reset_gpu_cache(args.settle)
    timed("cpu_hit", hit_seeds)
    if second_sight:  # the batch's first computation was miss_batch
        timed("miss_again_batch", batch, batched=True)
    runner.reset_gpu_cache(args.settle)
    timed("cpu_hit_batch", batch, batched=True)


def _mode(name: str) -> str:
    """A mode, a vlmcache mode with another admission (``vlmcache@second_sight``) or without
    its persistent tier (``vlmcache@memory``), either repeated in another engine process on a
    store of its own (``vllm#2``)."""
    spec, mark, repeat = name.partition("#")
    base, at, admission = spec.partition("@")
    if base not in MODES + DIAGNOSTIC_MODES:
        raise argparse.ArgumentTypeError(
            f"unknown mode {base!r}: one of {', '.join(MODES + DIAGNOSTIC_MODES)}")
    if at and admission not in ORDER_VARIANTS and (not base.startswith("vlmcache")
                                                   or admission not in VARIANTS):
        raise argparse.ArgumentTypeError(
            f"{name!r}: a mode takes @{' or @'.join(ORDER_VARIANTS)}; vlmcache modes also "
            f"@{', @'.join(VARIANTS)}")
    if mark and not (repeat.isdigit() and int(repeat) >= 2):
        raise argparse.ArgumentTypeError(f"{name!r}: a repeat is #2, #3, ...")
    return name


def _groups(modes: str) -> list[list[str]]:
    """``--modes``: groups in order, a group's modes at once. A mode runs once; a restart
    reads what its capture mode stored, so it runs in a later group."""
    groups = [[_mode(m) for m in group.split("+")] for group in modes.split(",")]
    names = [m for g in groups for m in g]
    if len(set(names)) < len(names):
        raise SystemExit(f"--modes {modes!r}: a mode is named twice")
    for g in groups:
        for m in g:
            capture = m.replace("_restart", "")
            if m != capture and capture in g:
                raise SystemExit(f"--modes {modes!r}: {m} reads what {capture} stores; "
                                 "run it in a later group (after a comma)")
    return groups


def _child_args(name: str, args: argparse.Namespace) -> str:
    """The base mode a child runs; a variant's admission (or disk budget) and a repeat's
    store set in ``args`` (a restart mode shares its capture mode's store: same variant and
    repeat)."""
    spec, _, repeat = name.partition("#")
    base, _, variant = spec.partition("@")
    if variant == "memory":
        args.disk_bytes, args.store = 0, f"{args.store}-{variant}"
    elif variant == "tight":
        args.stack_room, args.store = False, f"{args.store}-{variant}"
    elif variant in ORDER_VARIANTS:  # its environment was set when it started
        args.store = f"{args.store}-{variant}"
    elif variant in LAYOUTS:
        args.kv_block_layout, args.store = variant, f"{args.store}-{variant}"
    elif variant:
        args.admission_memory, args.store = variant, f"{args.store}-{variant}"
    if repeat:
        args.store = f"{args.store}-r{repeat}"
    return base


def _store_dirs(store: Path) -> list[Path]:
    """The stores of one run: ``store`` and its variants' (``store-memory``, ``store-fs``)."""
    return [p for p in store.parent.glob(f"{store.name}*") if p.is_dir()]


def _clear_stores(store: Path) -> None:
    """A run starts on empty stores: rows an earlier run left in the same work folder would
    turn its misses into loads (a GPU session's third job once measured such "misses")."""
    for path in _store_dirs(store):
        shutil.rmtree(path)


def _require_empty(store: Path) -> None:
    """A store given by name is never wiped: one that holds anything is refused."""
    for path in _store_dirs(store):
        if any(path.iterdir()):
            raise SystemExit(f"--store {store}: {path} is not empty; its rows would turn "
                             "this run's misses into loads (give an empty or new path)")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--geometry", default="benchmarks/geometries/qwen2vl7b")
    parser.add_argument("--n", type=int, default=12, help="batch-1 requests per phase")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batch-repeats", type=int, default=3,
                        help="first-sight batches, other prompts each (the ratio is their median)")
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
    parser.add_argument("--modes", default=",".join(MODES),
                        help="comma-separated; modes joined by + run at once, taking turns "
                        "request by request (vllm+vlmcache)")
    parser.add_argument("--mode-timeout", type=int, default=240)
    parser.add_argument("--pin-cpus", action="store_true",
                        help="modes taking turns run on disjoint sets of this machine's cores")
    parser.add_argument("--flush-timeout", type=int, default=180,
                        help="seconds a finished mode's I/O process may take to write out")
    parser.add_argument("--out", default="benchmarks/results/gpu-native-path.json")
    parser.add_argument("--profile-phases", default="",
                        help="comma-separated: profile only these phases")
    parser.add_argument("--profile-native", action="store_true",
                        help="py-spy --native: C frames too (slower sampling)")
    parser.add_argument("--profile-dir", default="",
                        help="py-spy collapsed stacks of the batch-1 phases (py-spy on PATH)")
    parser.add_argument("--store", default="")
    parser.add_argument("--work", default="")
    parser.add_argument("--child", type=_mode, help=argparse.SUPPRESS)
    parser.set_defaults(stack_room=True)  # False in vlmcache@tight
    parser.add_argument("--child-out", help=argparse.SUPPRESS)
    parser.add_argument("--turns", default="", help=argparse.SUPPRESS)
    parser.add_argument("--admission-memory", default=VlmCacheConfig().admission_memory,
                        choices=ADMISSIONS,
                        help="vlmcache's admission to vLLM's CPU region (vlmcache modes)")
    parser.add_argument("--kv-block-layout", default=VlmCacheConfig().kv_block_layout,
                        choices=LAYOUTS,
                        help="vlmcache's kv_block_layout (vlmcache modes, native_wired)")
    parser.add_argument("--merge", nargs="+", metavar="FILE",
                        help="merge these result files into --out, and run nothing")
    args = parser.parse_args(argv)
    if args.merge:
        merge_files(args.merge, args.out)
        return
    groups = _groups(args.modes)
    if args.child:
        base = _child_args(args.child, args)
        Path(args.child_out).write_text(json.dumps(run_mode(base, args)))
        return
    args.work = args.work or tempfile.mkdtemp(prefix="vlmcache-native-")
    Path(args.work).mkdir(parents=True, exist_ok=True)
    if args.store:
        _require_empty(Path(args.store))
    else:
        args.store = str(Path(args.work) / "store")
        _clear_stores(Path(args.store))
    forwarded = [a for a in (argv if argv is not None else sys.argv[1:])]
    forwarded += ["--store", args.store, "--work", args.work]
    import signal

    signal.signal(signal.SIGTERM, kill_running)
    signal.signal(signal.SIGINT, kill_running)
    modes: dict[str, Any] = {}
    for group in groups:
        for mode, result in run_group(group, args, forwarded).items():
            modes[mode] = result
            print(mode, json.dumps(result)[-1500:], flush=True)
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
    settings = {"n_batch1": args.n, "batch": args.batch, "batch_repeats": args.batch_repeats,
                "cpu_bytes": args.cpu_bytes,
                "block_size": args.block_size, "admission_memory": args.admission_memory}
    merge_shape(record, Path(args.geometry).name, [cmd.strip()], modes, settings)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
