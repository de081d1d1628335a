"""The KV tier under tensor parallelism (issue 35): a TP=2 engine's rows after a restart, and
a TP=1 engine on the same store (another namespace: it must load none of them).

Three ``vlmcache serve`` servers, one after the other, on one store (``kv_cost_model`` off,
so that every row the store holds is loaded; ``disk_write: sync``, so that a stop loses
none; ``admission_memory: always``, so that a prompt seen once is stored):

1. ``first``: TP=``--tp`` (2 on the lent 2-GPU machine), ``--n`` image prompts, each once
   (misses: their KV is stored);
2. ``restart``: TP=``--tp`` again, a new process: the same prompts, loaded from the store
   (vLLM's GPU and vlmcache's CPU tiers are gone). A full load is the block-aligned prefix
   below the last prompt token;
3. ``other_tp``: TP=``--other-tp`` (1) on the same store: the same prompts load 0 tokens
   (the namespace names ``tp=``, ``vllm/namespace.py``).

    python benchmarks/tp_restart.py --geometry benchmarks/geometries/llava7b --tp 2
    python benchmarks/tp_restart.py --smoke    # the CPU: tiny-vqa, TP=1 both (harness only)
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from vlmcache.testing.server import ServerProcess
from vlmcache_lab.serve_gpu_servers import gpus_and_cores, write_result
from vlmcache_lab.serve_gpu_trace import ImageSpec, image_data_url

log = logging.getLogger(__name__)

QUESTION = "what colour is the biggest shape?"
TENANT = "tp-tenant"


def loadable(prompt_tokens: int, block_size: int) -> int:
    """The block-aligned prefix a full load is (vLLM always computes the last token)."""
    return max(prompt_tokens - 1, 0) // block_size * block_size


def phase_summary(rows: Sequence[dict[str, Any]], block_size: int) -> dict[str, Any]:
    """Totals of one phase: prompt tokens, tokens loaded / stored, and whether every
    answered request loaded its full block-aligned prefix."""
    ok = [r for r in rows if "error" not in r]
    full = [r["tokens_loaded"] >= loadable(r["prompt_tokens"], block_size) > 0 for r in ok]
    return {"requests": len(rows), "errors": len(rows) - len(ok),
            "prompt_tokens": sum(r["prompt_tokens"] for r in ok),
            "loadable_tokens": sum(loadable(r["prompt_tokens"], block_size) for r in ok),
            "tokens_loaded": sum(r["tokens_loaded"] for r in ok),
            "tokens_from_prefix_cache": sum(r["tokens_from_prefix_cache"] for r in ok),
            "blocks_saved_reported": sum(r["blocks_saved"] for r in ok),
            "all_loaded_in_full": bool(ok) and all(full)}


def verdict(phases: dict[str, dict[str, Any]]) -> dict[str, Any]:
    first, again, other = phases.get("first"), phases.get("restart"), phases.get("other_tp")
    return {"restart_loads_in_full": bool(again and again["all_loaded_in_full"]
                                          and not again["errors"]),
            "other_tp_loads_zero": bool(other and other["tokens_loaded"] == 0
                                        and not other["errors"]),
            "first_stored_tokens": first.get("tokens_stored") if first else None}


def ask(url: str, model: str, seed: int, k: int) -> dict[str, Any]:
    """One chat request (non-streamed): the vlmcache report's token figures."""
    import httpx

    body = {"model": model, "temperature": 0, "max_tokens": 4, "cache_salt": TENANT,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": image_data_url(ImageSpec(k), seed)}},
                {"type": "text", "text": QUESTION}]}]}
    t0 = time.perf_counter()
    try:
        resp = httpx.post(url + "/v1/chat/completions", json=body, timeout=300)
        resp.raise_for_status()
        report = resp.json()["vlmcache"]
    except Exception as exc:  # recorded, never hidden
        return {"k": k, "error": repr(exc)[:300]}
    return {"k": k, "e2e_ms": round((time.perf_counter() - t0) * 1e3, 1),
            "hit_tier": report.get("hit_tier"),
            **{key: int(report.get(key) or 0) for key in (
                "prompt_tokens", "tokens_loaded", "tokens_from_prefix_cache", "blocks_saved")},
            "kv_cost_choice": report.get("kv_cost_choice")}


def store_stats(store: Path) -> dict[str, Any] | None:
    """``vlmcache stats --json`` of the store (chunks and bytes)."""
    out = subprocess.run([sys.executable, "-m", "vlmcache.cli", "stats", "--store", str(store),
                          "--json"], capture_output=True, text=True, timeout=120)
    try:
        return dict(json.loads(out.stdout))
    except ValueError:
        return {"error": (out.stderr or out.stdout)[-500:]}


def run(args: Any, argv: Sequence[str]) -> dict[str, Any]:
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = args.geometry
    if args.smoke and not model:
        from vlmcache.models.tiny_vqa import build_tiny_vqa

        model = str(build_tiny_vqa(work / "tiny-vqa"))
    block = args.block_size
    config: dict[str, object] = {
        "store_path": str(work / "store"), "block_size": block, "kv_cost_model": False,
        "disk_write": "sync", "admission_memory": "always", "enable_response_cache": False,
        "log_requests": False, "tenant_salt": "tp-bench-salt"}
    if not args.smoke:
        config.update(model_revision="dummy-weights", disk_budget="32GiB")
    else:
        config.update(memory_budget="256MiB")
    phases: dict[str, dict[str, Any]] = {}
    chunks = 0  # the store's KV chunks before the phase
    rows: dict[str, list[dict[str, Any]]] = {}
    timings: dict[str, float] = {}
    for name, tp in (("first", args.tp), ("restart", args.tp), ("other_tp", args.other_tp)):
        flags = ["--tensor-parallel-size", str(tp), "--max-model-len", str(args.max_model_len)]
        if not args.smoke:
            flags += ["--load-format", "dummy", "--enable-prefix-caching",
                      "--gpu-memory-utilization", str(args.gpu_memory_utilization)]
        server = ServerProcess(Path(model), config, work / f"{name}.log", flags)
        t0 = time.perf_counter()
        try:
            server.start()
            timings[f"{name}_start_s"] = round(time.perf_counter() - t0, 1)
            rows[name] = [ask(server.url, model, args.seed, k) for k in range(args.n)]
        except Exception as exc:  # a phase that fails is recorded; the next still runs
            log.warning("phase %s failed: %s", name, exc)
            rows[name] = [{"k": -1, "error": repr(exc)[-1500:]}]
        finally:
            server.stop()
        store = store_stats(work / "store") or {}
        added = int(store.get("kv_chunks") or 0) - chunks
        chunks += added
        phases[name] = {"tp": tp, **phase_summary(rows[name], block), "store": store,
                        "kv_chunks_added": added, "tokens_stored": added * block}
        log.warning("phase %s: %s", name, json.dumps({k: v for k, v in phases[name].items()
                                                      if k != "store"}))
    import vllm

    return {"command": "python benchmarks/tp_restart.py " + " ".join(argv),
            "device": args.device or gpus_and_cores(), "vllm_version": str(vllm.__version__),
            "model": model, "smoke": bool(args.smoke), "block_size": block,
            "config": {k: v for k, v in config.items() if k != "tenant_salt"},
            "tokens_stored_definition": "KV chunks the phase added to the store x block_size "
                                        "(kv_block_layout cross_layer: one chunk a block); "
                                        "rows' blocks_saved are those reported by the time "
                                        "each answer left",
            "n_prompts": args.n, "timings": timings, "phases": phases, "rows": rows,
            "verdict": verdict(phases)}


def parse_args(argv: Sequence[str] | None) -> Any:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--geometry", default=None)
    p.add_argument("--smoke", action="store_true", help="the CPU: tiny-vqa, TP=1 both")
    p.add_argument("--tp", type=int, default=None, help="GPU 2, smoke 1")
    p.add_argument("--other-tp", type=int, default=1)
    p.add_argument("--n", type=int, default=8, help="image prompts per phase")
    p.add_argument("--block-size", type=int, default=None, help="GPU 16, smoke 32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-model-len", type=int, default=None, help="GPU 4096, smoke 1024")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.8)
    p.add_argument("--work", default="/tmp/tp-restart-work")
    p.add_argument("--device", default=None)
    p.add_argument("--out", default="tp2-gpu.json")
    args = p.parse_args(argv)
    for key, gpu, cpu in (("tp", 2, 1), ("block_size", 16, 32), ("max_model_len", 4096, 1024)):
        if getattr(args, key) is None:
            setattr(args, key, cpu if args.smoke else gpu)
    if not args.smoke and not args.geometry:
        p.error("--geometry is needed (or --smoke)")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(message)s")
    write_result(args.out, run(args, argv))
    return 0

