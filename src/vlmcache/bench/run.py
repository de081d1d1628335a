"""``vlmcache bench``: one run, every mode side by side, on a dataset of your own or ours.

    vlmcache bench                                   # built-in easy-vqa + tiny-vqa model
    vlmcache bench --dataset my.jsonl --model /models/llava-1.5-7b \\
        --prompt-template "USER: <image>\\n{question} ASSISTANT:"
    vlmcache bench --dataset gqa/testdev_balanced_questions.json --images gqa/images ...
    vlmcache bench --workload video --n 35          # synthetic clips, tiny LLaVA-NeXT-Video

Each mode runs in its own engine process over the same requests (see ``bench.modes``);
the run writes ``results.json``, ``summary.md``, ``plot.png``, per-mode request rows
(``rows-<mode>.jsonl``) and the per-request log lines (``requests.log``) to ``--out``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from vlmcache.bench.harness import BUILTIN_MODEL, BenchSpec, build_requests, read_results
from vlmcache.bench.modes import MODES, parse_modes
from vlmcache.bench.types import RequestResult
from vlmcache.bench.video import BUILTIN_VIDEO_MODEL, KINDS

_ERROR_LINE = re.compile(r"^\S*(?:Error|Exception)\b.*$", re.MULTILINE)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """``vlmcache bench``'s options (shared by the CLI and ``python -m``)."""
    parser.add_argument("--workload", choices=("image", "video"), default="image",
                        help="image: the dataset's workloads (--workloads); video: a seeded "
                             "trace of synthetic clips (bench.video) on a tiny video model")
    parser.add_argument("--dataset", default="easy-vqa",
                        help="easy-vqa (built in), a JSONL file (image, question, answer) "
                             "or a GQA questions JSON (with --images)")
    parser.add_argument("--images", help="image folder of a GQA-format dataset")
    parser.add_argument("--limit", type=int, default=400, help="dataset items used")
    parser.add_argument("--workloads", default="", help="comma list (default: all)")
    parser.add_argument("--n", type=int, default=160, help="requests in the run")
    parser.add_argument("--modes", default="all", help=f"comma list of: {', '.join(MODES)}")
    parser.add_argument("--model", default=BUILTIN_MODEL,
                        help="a local vLLM model directory (default: the built-in tiny-vqa)")
    parser.add_argument("--prompt-template", help="prompt with {question} and the model's "
                        "image placeholder (needed with --model)")
    parser.add_argument("--max-tokens", type=int, default=4)
    parser.add_argument("--threshold", type=float, default=0.85,
                        help="similarity threshold of the image and paraphrase tiers")
    parser.add_argument("--tenants", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--offload-gib", type=float, default=1.0,
                        help="CPU bytes (GiB) for vLLM's native offloading mode")
    parser.add_argument("--engine-arg", action="append", default=[], metavar="KEY=JSON",
                        help="extra vllm.LLM argument, e.g. max_model_len=2048 (repeatable)")
    parser.add_argument("--out", default="vlmcache-bench", help="output folder")
    parser.add_argument("--mode-timeout", type=int, default=1800, help="seconds per mode")


def spec_from_args(args: argparse.Namespace, store_root: str) -> BenchSpec:
    """A validated :class:`BenchSpec` (raises ``ConfigError`` naming a bad option)."""
    from vlmcache.errors import ConfigError

    if args.n < 1:
        raise ConfigError(f"--n must be >= 1, got {args.n}")
    if args.model != BUILTIN_MODEL and not args.prompt_template:
        raise ConfigError("--prompt-template is required with --model (e.g. "
                          "'USER: <image>\\n{question} ASSISTANT:')")
    if args.prompt_template and "{question}" not in args.prompt_template:
        raise ConfigError("--prompt-template must contain {question}")
    engine: dict[str, Any] = {}
    for item in args.engine_arg:
        key, sep, value = item.partition("=")
        try:
            engine[key] = json.loads(value) if sep else None
        except json.JSONDecodeError:
            engine[key] = value
        if not sep or not key:
            raise ConfigError(f"--engine-arg {item!r}: expected KEY=VALUE")
    workloads = tuple(w.strip() for w in args.workloads.split(",") if w.strip())
    spec = BenchSpec(dataset=args.dataset, image_dir=args.images, limit=args.limit,
                     workloads=workloads, n=args.n, seed=args.seed, tenants=args.tenants,
                     model=args.model, prompt_template=args.prompt_template,
                     max_tokens=args.max_tokens, threshold=args.threshold,
                     store_root=store_root, offload_gib=args.offload_gib, engine=engine)
    return _video_spec(spec, args) if args.workload == "video" else spec


def _video_spec(spec: BenchSpec, args: argparse.Namespace) -> BenchSpec:
    """The video trace's spec: no dataset; the built-in tiny video model is built beside
    the run's store (in the work folder), unless ``--model`` names another."""
    from vlmcache.errors import ConfigError

    if args.workloads or args.dataset != "easy-vqa" or args.images:
        raise ConfigError("--workload video replays its own trace of synthetic clips: "
                          "--dataset, --images and --workloads do not apply")
    builtin = spec.model == BUILTIN_MODEL
    return dataclasses.replace(
        spec, dataset="synthetic-clips", limit=None, workload="video",
        model=BUILTIN_VIDEO_MODEL if builtin else spec.model,
        model_dir=str(Path(spec.store_root).parent / "tiny-video"))


def run_modes(spec_path: Path, modes: Sequence[str], work: Path, n_requests: int,
              timeout: int) -> tuple[dict[str, list[RequestResult]], dict[str, str]]:
    """Each mode in its own process, with a progress bar; (results, unavailable reasons)."""
    from tqdm import tqdm

    results: dict[str, list[RequestResult]] = {}
    unavailable: dict[str, str] = {}
    for mode in modes:
        rows = work / f"rows-{mode.replace(':', '-')}.jsonl"
        with tqdm(total=n_requests, desc=f"{mode:<17}", unit="req", file=sys.stderr) as bar:
            reason = _run_child(spec_path, mode, rows, bar, timeout)
        if reason is None:
            results[mode] = read_results(rows)
        else:
            unavailable[mode] = reason
            print(f"vlmcache bench: mode {mode} did not run: {reason}", file=sys.stderr)
    return results, unavailable


def _run_child(spec_path: Path, mode: str, rows: Path, bar: Any, timeout: int) -> str | None:
    log = rows.with_suffix(".log")
    cmd = [sys.executable, "-m", "vlmcache.bench.harness", str(spec_path), mode, str(rows)]
    deadline = time.monotonic() + timeout
    with log.open("w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True)
        assert proc.stdout is not None
        for line in proc.stdout:
            parts = line.split()
            if len(parts) == 3 and parts[0] == "progress":
                bar.n = int(parts[1])
                bar.refresh()
            if time.monotonic() > deadline:
                proc.kill()
                return f"timed out after {timeout} s (log: {log})"
        code = proc.wait()
    if code == 0:
        return None
    # the root cause, not vLLM's "Engine core initialization failed. See root cause above."
    found = [line for line in _ERROR_LINE.findall(log.read_text(errors="replace"))
             if "root cause above" not in line]
    return f"exit {code}: {(found or ['see log'])[-1][:300]} (log: {log})"


def main(args: argparse.Namespace, argv: Sequence[str]) -> int:
    """Run the benchmark; returns the process exit code."""
    from vlmcache.bench.summary import (markdown_table, per_tier_table, summarize_run,
                                        token_table)

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    modes = parse_modes(args.modes)
    work = Path(tempfile.mkdtemp(prefix="vlmcache-bench-"))
    spec = spec_from_args(args, str(work / "store"))
    requests = build_requests(spec)  # validates the dataset before any engine starts
    spec_path = out / "spec.json"
    spec_path.write_text(spec.to_json())
    print(f"vlmcache bench: {len(requests)} requests x {len(modes)} modes -> {out}",
          file=sys.stderr)
    results, unavailable = run_modes(spec_path, modes, out, len(requests), args.mode_timeout)
    if not results:
        print("vlmcache bench: no mode ran", file=sys.stderr)
        return 1
    summary = summarize_run(results, unavailable)
    _write_outputs(out, argv, spec, requests, results, summary)
    print(markdown_table(summary))
    print(per_tier_table(summary))
    if spec.workload == "video":
        print(token_table(summary, KINDS))
    return 0


def _write_outputs(out: Path, argv: Sequence[str], spec: BenchSpec, requests: Sequence[Any],
                   results: dict[str, list[RequestResult]], summary: Any) -> None:
    import vllm

    from vlmcache.bench.plots import plot_run
    from vlmcache.bench.summary import markdown_table, per_tier_table, to_json, token_table

    record = {"command": "vlmcache bench " + shlex.join(argv), "device": device_label(),
              "vllm_version": vllm.__version__, "spec": json.loads(spec.to_json()),
              "requests": len(requests), "summary": to_json(summary)}
    (out / "results.json").write_text(json.dumps(record, indent=1) + "\n")
    (out / "summary.md").write_text(
        f"# vlmcache bench\n\n- command: `{record['command']}`\n- device: {record['device']}\n"
        f"- vLLM {record['vllm_version']}; {len(requests)} requests per mode\n\n"
        f"{markdown_table(summary)}\n\n{per_tier_table(summary)}\n"
        + (f"\n{token_table(summary, KINDS)}\n" if spec.workload == "video" else ""))
    with (out / "requests.log").open("w") as f:
        for mode, rows in results.items():
            f.writelines(f"{mode}\t{r.index}\t{r.log_line}\n" for r in rows)
    plot_run(summary, out / "plot.png", f"vlmcache bench: {spec.dataset}, {len(requests)} "
             f"requests, {device_label()}")
    print(f"wrote {out}/results.json, summary.md, plot.png, requests.log", file=sys.stderr)


def device_label() -> str:
    """What ran the benchmark, in words."""
    try:
        import torch

        if torch.cuda.is_available():
            return f"{torch.cuda.get_device_name(0)}"
    except ImportError:
        pass
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"CPU ({platform.machine()}, {cores} cores)"
