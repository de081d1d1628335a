"""The issue's targets, judged on the committed results (GPU runs, lookup latency, CPU bench).

    python benchmarks/targets.py        # prints the table and writes benchmarks/results/targets.md

Two configurations of vlmcache are judged on the GPU: the default (memory + disk tiers,
disk writes behind) and memory-only (``disk_budget=0``), both from the same run. The GPU
runs are history: they measured the retired hand-written KV path (``gpu-history/``, made by
``benchmarks/gpu_latency.py`` as of commit d483cf3). The current KV path's targets are in
``gpu-native-path.json`` (``shapes``), written by ``benchmarks/gpu_native_path.py``.
"""

import json
import sys
from pathlib import Path

from vlmcache.bench.harness import read_results
from vlmcache.bench.summary import summarize_run, targets_table

RESULTS = Path("benchmarks/results")
SHAPES = {"gpu-history/gpu-llava7b.json": "llava-1.5-7b",
          "gpu-history/gpu-qwen2vl7b.json": "qwen2-vl-7b"}  # the retired path's runs
KEYS = ("recompute_ms", "gpu_hit_ms", "native_offload_hit_ms", "vlmcache_cpu_hit_ms",
        "vlmcache_disk_hit_ms", "capture_miss_ms", "nocache_batch_tok_s", "capture_batch_tok_s")
MEMORY_ONLY = {"vlmcache_cpu_hit_ms": "memory_only_cpu_hit_ms",
               "capture_miss_ms": "memory_only_capture_miss_ms",
               "capture_batch_tok_s": "memory_only_capture_batch_tok_s"}


def gpu_mapping(memory_only: bool) -> dict:
    shapes = {}
    for file, name in SHAPES.items():
        path = RESULTS / file
        if not path.exists():
            continue
        head = json.loads(path.read_text())["headline"]
        values = {k: head.get(MEMORY_ONLY.get(k, k) if memory_only else k) for k in KEYS}
        if memory_only:
            values["vlmcache_disk_hit_ms"] = None
            if values["vlmcache_cpu_hit_ms"] is None:
                continue
        shapes[name] = values
    lookup = json.loads((RESULTS / "lookup-latency.json").read_text())
    p50 = lookup["scenarios"]["hit"]["resolve_fresh_ms"]["p50"]
    return {"shapes": shapes, "lookup_p50_ms": p50, "lookup_entries": lookup["entries_per_tier"]}


def cpu_summary(folder: Path):
    if not folder.is_dir():
        return None
    results = {p.stem[5:].replace("vlmcache-", "vlmcache:", 1): read_results(p)
               for p in sorted(folder.glob("rows-*.jsonl"))}
    return summarize_run(results, {}) if results else None


def main() -> None:
    cpu = cpu_summary(RESULTS / (sys.argv[1] if len(sys.argv) > 1 else "bench-cpu-easyvqa"))
    parts = ["# Targets (issue 6), judged on the committed results", "",
             "GPU rows: the retired hand-written KV path (`gpu-history/`, "
             "`benchmarks/gpu_latency.py` as of commit d483cf3); the current path's "
             "targets are in `gpu-native-path.json` (`shapes`).", "",
             "## vlmcache default (memory + disk tiers, disk writes behind)", "",
             targets_table(gpu_mapping(False), cpu), "",
             "## vlmcache memory-only (`disk_budget=0`), same GPU runs", "",
             targets_table(gpu_mapping(True), cpu)]
    text = "\n".join(parts) + "\n"
    (RESULTS / "targets.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
