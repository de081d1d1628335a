#!/usr/bin/env python
"""Smoke-test the tiny random LLaVA (vlmcache.testing.tiny_llava) on vLLM.

Builds the model (into a temp dir unless --model-dir is given), starts one vLLM engine

    LLM(model=..., gpu_memory_utilization=0.3, max_model_len=1024, block_size=32,
        enforce_eager=True, seed=0)          # env VLLM_CPU_KVCACHE_SPACE=1 (GiB)

and runs two image prompts (TINY_LLAVA_PROMPT with EXAMPLE_QUESTIONS, images
make_test_image(0) / make_test_image(1)) greedily (max_tokens=8, temperature=0). Prints the
output token ids, len(prompt_token_ids), and timings; --json writes them to a file.

--runs N (N >= 2) re-runs this script N times in fresh processes, one after another (never
two engines at once), on the same build, and checks that all produce identical token ids.

--show-kv-layout also prints the KV cache tensors the worker allocated (shape, dtype,
stride), via LLM.collective_rpc (sets VLLM_ALLOW_INSECURE_SERIALIZATION=1 for that).

Needs the CPU fixes first: python scripts/fix_torchvision.py
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_SRC = Path(__file__).resolve().parent.parent / "src"
if _SRC.is_dir() and str(_SRC) not in sys.path:
    sys.path.insert(0, str(_SRC))


def _kv_layout(worker) -> list[dict]:  # runs inside the vLLM worker process
    runner = getattr(worker, "model_runner", worker)
    caches = getattr(runner, "kv_caches", None)
    out = []
    if isinstance(caches, dict):
        items = list(caches.items())
    else:
        items = list(enumerate(caches or []))
    for name, t in items:
        ts = t if isinstance(t, (list, tuple)) else [t]
        for i, x in enumerate(ts):
            out.append({
                "layer": str(name), "part": i, "shape": list(x.shape), "dtype": str(x.dtype),
                "stride": list(x.stride()), "device": str(x.device),
            })
    return out


def run_once(model_dir: Path, show_kv_layout: bool) -> dict:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if show_kv_layout:
        os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")
    from vlmcache.testing.tiny_llava import EXAMPLE_QUESTIONS, TINY_LLAVA_PROMPT, make_test_image

    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams

    t_import = time.perf_counter()
    llm = LLM(
        model=str(model_dir),
        gpu_memory_utilization=0.3,
        max_model_len=1024,
        block_size=32,
        enforce_eager=True,
        seed=0,
    )
    t_engine = time.perf_counter()
    prompts = [
        {
            "prompt": TINY_LLAVA_PROMPT.format(question=q),
            "multi_modal_data": {"image": make_test_image(i)},
        }
        for i, q in enumerate(EXAMPLE_QUESTIONS)
    ]
    params = SamplingParams(max_tokens=8, temperature=0)
    outs = llm.generate(prompts, params, use_tqdm=False)
    t_gen = time.perf_counter()
    # A second, identical call: exercises vLLM's own prefix cache (same ids expected).
    outs2 = llm.generate(prompts, params, use_tqdm=False)
    t_gen2 = time.perf_counter()

    result = {
        "model_dir": str(model_dir),
        "outputs": [
            {
                "prompt_tokens": len(o.prompt_token_ids),
                "token_ids": list(o.outputs[0].token_ids),
                "text": o.outputs[0].text,
                "num_cached_tokens": getattr(o, "num_cached_tokens", None),
            }
            for o in outs
        ],
        "repeat_token_ids": [list(o.outputs[0].token_ids) for o in outs2],
        "repeat_num_cached_tokens": [getattr(o, "num_cached_tokens", None) for o in outs2],
        "timing_s": {
            "import_vllm": round(t_import - t0, 2),
            "engine_start": round(t_engine - t_import, 2),
            "generate": round(t_gen - t_engine, 3),
            "generate_repeat": round(t_gen2 - t_gen, 3),
        },
    }
    if show_kv_layout:
        try:
            result["kv_layout"] = llm.collective_rpc(_kv_layout)[0]
        except Exception as e:  # informational only
            result["kv_layout_error"] = f"{type(e).__name__}: {e}"
    _shutdown(llm)
    return result


def _shutdown(llm) -> None:
    """Stop the engine-core process now instead of at interpreter exit."""
    t0 = time.perf_counter()
    try:
        llm.llm_engine.engine_core.shutdown(timeout=5)
    except Exception as e:  # API differs between vLLM versions
        print(f"(explicit engine shutdown failed: {type(e).__name__}: {e})", flush=True)
    print(f"engine shut down in {time.perf_counter() - t0:.1f} s", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", type=Path, help="build/reuse the model here (default: a temp dir)")
    ap.add_argument("--json", type=Path, help="write the result here")
    ap.add_argument("--runs", type=int, default=1,
                    help="N>=2: run N fresh processes in sequence and compare their token ids")
    ap.add_argument("--show-kv-layout", action="store_true")
    args = ap.parse_args()

    from vlmcache.testing.tiny_llava import build_tiny_llava, read_build_info

    t_start = time.perf_counter()
    tmp = None
    model_dir = args.model_dir
    if model_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="tiny-llava-")
        model_dir = Path(tmp.name) / "model"
    t0 = time.perf_counter()
    build_tiny_llava(model_dir)
    t_build = time.perf_counter() - t0
    print(f"model: {model_dir} (build/verify {t_build:.1f} s, "
          f"digest {read_build_info(model_dir)['digest'][:16]})", flush=True)

    if args.runs >= 2:
        results = []
        for i in range(args.runs):
            out = Path(tempfile.mkdtemp(prefix="tiny-llava-run-")) / "result.json"
            cmd = [sys.executable, __file__, "--model-dir", str(model_dir), "--json", str(out)]
            print(f"--- run {i + 1}/{args.runs}: fresh process", flush=True)
            subprocess.run(cmd, check=True)
            results.append(json.loads(out.read_text()))
        ids = [[o["token_ids"] for o in r["outputs"]] for r in results]
        same = all(x == ids[0] for x in ids)
        print(f"=== {args.runs} processes, token ids identical: {same}")
        for i, x in enumerate(ids):
            print(f"  run {i + 1}: {x}")
        print(f"total wall time {time.perf_counter() - t_start:.1f} s")
        return 0 if same else 1

    res = run_once(model_dir, args.show_kv_layout)
    res["timing_s"]["build"] = round(t_build, 2)
    res["timing_s"]["total"] = round(time.perf_counter() - t_start, 2)
    for i, o in enumerate(res["outputs"]):
        print(f"prompt {i}: len(prompt_token_ids)={o['prompt_tokens']} "
              f"token_ids={o['token_ids']} text={o['text']!r}")
    print(f"repeat: token_ids={res['repeat_token_ids']} "
          f"num_cached_tokens={res['repeat_num_cached_tokens']} "
          f"(same: {res['repeat_token_ids'] == [o['token_ids'] for o in res['outputs']]})")
    if "kv_layout" in res:
        layout = res["kv_layout"]
        print(f"kv cache: {len(layout)} tensors; first: {layout[0] if layout else None}")
    elif "kv_layout_error" in res:
        print(f"kv cache layout unavailable: {res['kv_layout_error']}")
    print("timing (s): " + ", ".join(f"{k}={v}" for k, v in res["timing_s"].items()))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    if tmp is not None:
        tmp.cleanup()
    return 0


if __name__ == "__main__":
    rc = main()
    # If interpreter teardown ever hangs (vLLM background threads), say where.
    import faulthandler

    faulthandler.dump_traceback_later(60, exit=False)
    sys.exit(rc)
