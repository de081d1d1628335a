"""GPU serving load benchmark: ``vlmcache serve`` vs plain vLLM's OpenAI server, open loop.

Both servers run at once on one GPU (same vLLM flags: prefix caching on, the same GPU
memory share, dummy weights of a 7B geometry from ``benchmarks/geometries/``) and take
turns: for each arrival rate, the next slice of one seeded trace (``serve_gpu_trace``) is
sent to one server, then the same slice to the other (plain first at the first and last
rate: the baseline runs first and last). Per rate and server: throughput, goodput under
the SLO, TTFT (at the first chunk carrying a token, ``serve_gpu_load``) / e2e percentiles,
TTFT and the front's time per stage on the requests the cache missed, hits per tier, the
prompt tokens by source (``prompt_tokens``: response tier, prefix cache, loaded, computed)
the GPU time per request (``gpu``: nvidia-smi's utilization over the phase, ``gpu_busy``)
and the engine's own TTFT / queue / prefill means (``engine``: vLLM's ``/metrics``,
``engine_metrics``), which split ours' excess on a miss into the engine's and the front's. ``--ours-layout proxy`` runs the front
in its own process (``serve_gpu_servers``); ``--paraphrase auto`` turns the paraphrase tiers
on where the text embedder is installed; ``--budget-s`` skips the rates that might not fit.

Time: a shape takes its servers' start (at once; ~45-75 s eager on an H200), then per rate
at most 2 x (phase + drain + pause) s (a side's drain only runs out when it is overloaded),
then ~10 s to stop. Two shapes of 5 rates at ``--phase-s 10 --drain-s 8 --pause-s 2`` fit
one 560 s device call with ``--budget-s 265`` each.

    python benchmarks/serve_gpu.py --geometry benchmarks/geometries/qwen2vl7b \\
        --rates 6,10,14,18,24 --phase-s 10 --drain-s 8 --pause-s 2 --ours-layout proxy \\
        --budget-s 265 --out serve-gpu-qwen2vl7b.json
    python benchmarks/serve_gpu.py --merge A.json B.json --out benchmarks/results/serve-gpu.json
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from vlmcache_lab.engine_metrics import phase_means, scrape
from vlmcache_lab.gpu_busy import GpuBusy
from vlmcache_lab.serve_gpu_load import (Slo, miss_ids, oracle_phase, run_phase, summarize,
                                         verdict)
from vlmcache_lab.serve_gpu_servers import (LAYOUTS, Server, engine_url, gpus_and_cores,
                                            make_servers, ours_config, start_servers,
                                            stop_servers, text_embedder_path, vllm_flags)
from vlmcache_lab.serve_gpu_trace import (ANSWERED_BEFORE, build_trace, composition,
                                          parse_mix, poisson_offsets)

log = logging.getLogger(__name__)
STOP_S = 15.0  # to stop both servers and write the result

def warm_up(servers: dict[str, Server], model: str, seed: int) -> None:
    """Unrelated requests each (first-request costs out of the measured phases): prompts of
    12 lengths, the later ones overlapping, so the engine's kernels meet the token counts a
    phase brings (Triton specializes on them: after 4 same-length warm-up requests a
    Qwen2-VL run logged a JIT compile of its rotary kernel around its first phase)."""
    from vlmcache_lab.serve_gpu_trace import ImageSpec, TraceRequest

    reqs = [TraceRequest("warm", "tenant-warm", ImageSpec(10_000_000 + k),
                         "warm up " + "please " * k + "?", 8 + 2 * k) for k in range(12)]
    offsets = [0.3 * k for k in range(4)] + [1.2 + 0.02 * k for k in range(8)]
    for server in servers.values():
        bodies = [r.body(model, seed) for r in reqs]
        asyncio.run(run_phase(server.url, bodies, ["warm"] * len(reqs), offsets, 120))


def run_rates(args: Any, servers: dict[str, Server], deadline: float
              ) -> tuple[list[dict[str, Any]], Any, list[float]]:
    """Every rate against both servers, taking turns, while the next one fits before
    ``deadline`` (``time.monotonic()``); returns the rates list, the trace and the rates
    skipped for lack of time."""
    rng = np.random.default_rng(args.seed)
    rates = [float(r) for r in args.rates.split(",")]
    schedules = [poisson_offsets(rate, args.phase_s, rng) for rate in rates]
    trace = build_trace(sum(len(s) for s in schedules), args.seed, parse_mix(args.mix),
                        args.zipf)
    out: list[dict[str, Any]] = []
    start = 0
    for k, (rate, offsets) in enumerate(zip(rates, schedules)):
        if time.monotonic() + rate_cost_s(args) > deadline:
            log.warning("rates %s skipped: not enough time left", rates[k:])
            return out, trace[:start], rates[k:]
        part = trace[start:start + len(offsets)]
        start += len(offsets)
        order = ("plain", "ours") if k % 2 == 0 or k == len(rates) - 1 else ("ours", "plain")
        out.append(_run_rate(args, servers, rate, part, offsets, order))
    return out, trace, []


def rate_cost_s(args: Any) -> float:
    """The most one rate can take: both servers' arrival windows, drains and pauses."""
    return 2 * (args.phase_s + args.drain_s + args.pause_s)


def _run_rate(args: Any, servers: dict[str, Server], rate: float, part: Sequence[Any],
              offsets: Sequence[float], order: Sequence[str]) -> dict[str, Any]:
    bodies = [r.body(args.geometry, args.seed) for r in part]
    kinds = [r.kind for r in part]
    rows: dict[str, Any] = {}
    busy: dict[str, Any] = {}
    engine: dict[str, Any] = {}
    for side in order:
        metrics_url = engine_url(servers[side])
        before = scrape(metrics_url)
        with GpuBusy() as gpu:  # the other server is idle meanwhile: this side's GPU time
            if side == "ours" and args.ours_layout == "oracle":
                phase = oracle_phase(servers[side].url, bodies, kinds, offsets, args.drain_s,
                                     ANSWERED_BEFORE)
            else:
                phase = run_phase(servers[side].url, bodies, kinds, offsets, args.drain_s)
            rows[side] = asyncio.run(phase)
        busy[side] = gpu.result()
        engine[side] = phase_means(before, scrape(metrics_url))
        time.sleep(args.pause_s)  # let the engine finish cancelled work
    entry = _rate_entry(rate, rows, order, composition(part), args)
    for side, figures in busy.items():
        entry[side]["engine"] = engine[side]  # vLLM's own TTFT / queue / prefill means
        entry[side]["gpu"] = None if figures is None else {
            **figures, "s_per_request": round(figures["busy_s"] / max(len(bodies), 1), 4)}
    log.warning("rate %s: %s", rate, json.dumps(
        {s: {k: entry[s][k] for k in ("throughput_rps", "goodput_rps", "ttft_p50_ms",
                                         "e2e_p99_ms", "ttft_by")} for s in ("ours", "plain")}))
    return entry


def _rate_entry(rate: float, rows: dict[str, Any], order: Sequence[str],
                comp: dict[str, Any], args: Any) -> dict[str, Any]:
    slo = Slo(args.slo_ttft_ms, args.slo_e2e_ms)
    ours_rows, ours_wall = rows["ours"]
    plain_rows, plain_wall = rows["plain"]
    ours = summarize(ours_rows, ours_wall, slo)
    plain = summarize(plain_rows, plain_wall, slo, miss_ids=miss_ids(ours_rows))
    ours["hits_by_kind"] = _hits_by_kind(ours_rows)
    return {"rate": rate, "order": list(order), "requests": comp["requests"],
            "slice_composition": comp, "ours": ours, "plain": plain}


def _hits_by_kind(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for r in rows:
        if r["status"] == 200:
            tiers = out.setdefault(r["kind"], {})
            tiers[r["tier"] or "?"] = tiers.get(r["tier"] or "?", 0) + 1
    return out


def parse_args(argv: Sequence[str] | None) -> Any:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--geometry", help="model folder (config + tokenizer; dummy weights)")
    p.add_argument("--rates", default="4,12,24,48", help="arrival rates, requests/s")
    p.add_argument("--phase-s", type=float, default=20.0, help="arrival window per rate")
    p.add_argument("--drain-s", type=float, default=45.0,
                   help="wait after the last arrival; unfinished requests count as failed")
    p.add_argument("--pause-s", type=float, default=3.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--mix", default=None, help="kind=share,... over the default mix "
                   "(kinds: repeat, jpeg, frame, paraphrase, followup, new, flood)")
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--slo-ttft-ms", type=float, default=1000.0)
    p.add_argument("--slo-e2e-ms", type=float, default=3000.0)
    p.add_argument("--gpu-memory-utilization", type=float, default=0.4)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--ours-config", default="{}", help="JSON merged into the vlmcache config")
    p.add_argument("--ours-layout", default="inprocess", choices=LAYOUTS,
                   help="inprocess: the front in vLLM's API server (`vlmcache serve`); proxy: "
                   "`vlmcache proxy` in its own process before `vlmcache serve "
                   "--vlmcache-no-front`; oracle: no vlmcache, plain vLLM sent only what "
                   "no earlier request answered (the rest answered at once): any cache's "
                   "ceiling on the trace")
    p.add_argument("--proxy-workers", type=int, default=1,
                   help="with --ours-layout proxy: its front processes (more than 1: a "
                   "loopback redis-server is started for them to share through)")
    p.add_argument("--paraphrase", default="auto", choices=("auto", "on", "off"),
                   help="the paraphrase tiers; auto: on where the text embedder is installed")
    p.add_argument("--budget-s", type=float, default=0.0,
                   help="this shape's time from start to result; a rate that might not "
                   "fit (2 x (phase + drain + pause) + 15 s to stop) is skipped; 0: no limit")
    p.add_argument("--work", default="/tmp/serve-gpu-work")
    p.add_argument("--device", default=None, help="what to write as `device`")
    p.add_argument("--merge", nargs="+", default=None, help="per-shape files to join")
    p.add_argument("--note", action="append", default=[],
                   help="with --merge: a finding to keep beside the figures (repeatable)")
    p.add_argument("--out", default="serve-gpu.json")
    return p.parse_args(argv)


def merge(files: Sequence[str], argv: Sequence[str], notes: Sequence[str]) -> dict[str, Any]:
    """Per-shape result files -> one file with ``shapes``; common fields from the first."""
    docs = [json.loads(Path(f).read_text()) for f in files]
    merged = {k: v for k, v in docs[0].items() if k not in ("shapes", "command")}
    merged["commands"] = [d["command"] for d in docs]
    own = list(argv)[:list(argv).index("--note")] if "--note" in argv else list(argv)
    merged["merged_by"] = "python benchmarks/serve_gpu.py " + " ".join(own) + " --note ... (notes)"
    merged["shapes"] = {k: {**v, "trace_composition": d["trace"]["composition"]}
                        for d in docs for k, v in d["shapes"].items()}
    merged["trace"] = {k: v for k, v in docs[0]["trace"].items() if k != "composition"}
    merged["notes"] = list(notes)
    return merged


def main(argv: Sequence[str] | None = None) -> int:
    """Run one shape (or ``--merge``) and write the JSON."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    if args.merge:
        result = merge(args.merge, argv, args.note)
    else:
        result = run_shape(args, argv)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def run_shape(args: Any, argv: Sequence[str]) -> dict[str, Any]:
    import vllm

    t0 = time.monotonic()
    deadline = t0 + args.budget_s - STOP_S if args.budget_s else float("inf")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    servers = make_servers(args, work)
    start_s = start_servers(servers)
    try:
        warm_up(servers, args.geometry, args.seed)
        rates, trace, skipped = run_rates(args, servers, deadline)
    finally:
        stop_servers(servers)
    shape = Path(args.geometry).name
    embedder = text_embedder_path()
    return {"command": "python benchmarks/serve_gpu.py " + " ".join(argv),
            "device": args.device or _device(args.ours_layout),
            "vllm_version": vllm.__version__,
            "vllm_flags": ["--enforce-eager", *vllm_flags(args)],
            "ours_layout": args.ours_layout,
            "ours_config": None if args.ours_layout == "oracle" else ours_config(args),
            "text_embedder": str(embedder) if embedder else None,
            "trace": {"seed": args.seed, "zipf_s": args.zipf, "mix": parse_mix(args.mix),
                      "composition": composition(trace), "generator":
                      "benchmarks/vlmcache_lab/serve_gpu_trace.py build_trace(n, seed, mix)"},
            "slo": Slo(args.slo_ttft_ms, args.slo_e2e_ms).as_dict(),
            "ttft": "first chunk carrying a token: usage.completion_tokens >= 1 "
                    "(stream_options.continuous_usage_stats), else text or a finish reason",
            "phase_s": args.phase_s, "drain_s": args.drain_s, "pause_s": args.pause_s,
            "server_start_s": start_s, "shape_wall_s": round(time.monotonic() - t0, 1),
            "shapes": {shape: {"rates": rates, "skipped_rates": skipped,
                               "verdict": verdict(rates)}}}


def _device(layout: str) -> str:
    where = {"proxy": "the front in its own process (vlmcache proxy)",
             "oracle": "'ours' is the oracle: a second plain server behind a perfect cache"
             }.get(layout, "the front in vLLM's API server")
    return f"{gpus_and_cores()}; both servers on one GPU, loopback HTTP; {where}"
