#!/usr/bin/env python
"""Smoke-test the tiny random LLaVA-NeXT-Video (vlmcache.testing.tiny_video) on vLLM.

Builds the model (into a temp dir unless --model-dir is given), starts one vLLM engine

    LLM(model=..., gpu_memory_utilization=0.3, max_model_len=2048, block_size=32,
        enable_prefix_caching=True, limit_mm_per_prompt={"video": 1},
        enforce_eager=True, seed=0)          # env VLLM_CPU_KVCACHE_SPACE=1 (GiB)

and sends chat requests (``llm.chat``, greedy, max_tokens=8) whose user message holds a
``video_url`` part (a ``data:video/mp4;base64,...`` URL of an 8-frame synthetic clip,
vlmcache.testing.clips) and a question:

  A        clip A (seed 0, mp4v)                   cold
  A again  the same bytes                          prefix-cache hit expected
  B        clip B (seed 1)                         other tokens, no hit expected
  A/ffv1   clip A's frames, lossless FFV1 bytes    vLLM hashes the bytes: no hit expected
  A uuid=X clip A with "uuid": "X" on the part     new identity: no hit
  B uuid=X clip B under A's uuid                   A's hit and A's tokens expected

Prints, per request, len(prompt_token_ids), num_cached_tokens, the output token ids and
the time; --json writes them to a file. Needs the CPU fixes first (scripts/fix_torchvision.py).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

_SRC = Path(__file__).resolve().parent.parent / "src"
if _SRC.is_dir() and str(_SRC) not in sys.path:
    sys.path.insert(0, str(_SRC))


def _messages(url: str, question: str, uuid: str | None = None) -> list[dict]:
    part = {"type": "video_url", "video_url": {"url": url}}
    if uuid is not None:
        part["uuid"] = uuid  # vLLM's multi_modal_uuids: the video's identity in its caches
    return [{"role": "user", "content": [part, {"type": "text", "text": question}]}]


def _requests() -> list[tuple[str, list[dict]]]:
    from vlmcache.testing.clips import CODECS, synthetic_frames, video_data_url, write_clip
    from vlmcache.testing.tiny_video import VIDEO_QUESTIONS

    q = VIDEO_QUESTIONS[0]
    frames_a, frames_b = synthetic_frames(0, 8), synthetic_frames(1, 8)
    url_a = video_data_url(write_clip(None, frames_a, 4.0, "mp4v"))
    url_b = video_data_url(write_clip(None, frames_b, 4.0, "mp4v"))
    url_a_ffv1 = video_data_url(write_clip(None, frames_a, 4.0, "ffv1"), CODECS["ffv1"].mime)
    return [
        ("A", _messages(url_a, q)),
        ("A again", _messages(url_a, q)),
        ("B", _messages(url_b, q)),
        ("A/ffv1", _messages(url_a_ffv1, q)),
        ("A uuid=X", _messages(url_a, q, uuid="X")),
        ("B uuid=X", _messages(url_b, q, uuid="X")),
    ]


def run_once(model_dir: Path) -> dict:
    """Start one engine, send the requests one at a time, return what happened."""
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    t0 = time.perf_counter()
    from vllm import LLM, SamplingParams

    t_import = time.perf_counter()
    llm = LLM(model=str(model_dir), gpu_memory_utilization=0.3, max_model_len=2048,
              block_size=32, enable_prefix_caching=True, limit_mm_per_prompt={"video": 1},
              enforce_eager=True, seed=0)
    t_engine = time.perf_counter()
    params = SamplingParams(max_tokens=8, temperature=0)
    rows = []
    for name, messages in _requests():
        t = time.perf_counter()
        out = llm.chat(messages, params, use_tqdm=False)[0]
        rows.append({
            "request": name,
            "prompt_tokens": len(out.prompt_token_ids),
            "num_cached_tokens": out.num_cached_tokens,
            "token_ids": list(out.outputs[0].token_ids),
            "seconds": round(time.perf_counter() - t, 3),
        })
    _shutdown(llm)
    return {"model_dir": str(model_dir), "requests": rows, "timing_s": {
        "import_vllm": round(t_import - t0, 2), "engine_start": round(t_engine - t_import, 2)}}


def _shutdown(llm) -> None:
    """Stop the engine-core process now instead of at interpreter exit."""
    try:
        llm.llm_engine.engine_core.shutdown(timeout=5)
    except Exception as e:  # API differs between vLLM versions
        print(f"(explicit engine shutdown failed: {type(e).__name__}: {e})", flush=True)


def _verdicts(rows: dict[str, dict]) -> dict[str, bool]:
    a, b = rows["A"], rows["B"]
    return {
        "repeat hits the prefix cache": rows["A again"]["num_cached_tokens"] > a["prompt_tokens"] // 2,
        "repeat gives the same tokens": rows["A again"]["token_ids"] == a["token_ids"],
        "other clip: other tokens": b["token_ids"] != a["token_ids"],
        "other clip: no hit": b["num_cached_tokens"] < 32,
        "same frames, other bytes: no hit": rows["A/ffv1"]["num_cached_tokens"] < 32,
        "new uuid: no hit": rows["A uuid=X"]["num_cached_tokens"] < 32,
        "uuid override: hit": rows["B uuid=X"]["num_cached_tokens"] > a["prompt_tokens"] // 2,
        "uuid override: A's tokens": rows["B uuid=X"]["token_ids"] == rows["A uuid=X"]["token_ids"],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model-dir", type=Path, help="build/reuse the model here (default: a temp dir)")
    ap.add_argument("--json", type=Path, help="write the result here")
    args = ap.parse_args()

    from vlmcache.testing.tiny_video import build_tiny_video, read_build_info

    tmp = None
    model_dir = args.model_dir
    if model_dir is None:
        tmp = tempfile.TemporaryDirectory(prefix="tiny-video-")
        model_dir = Path(tmp.name) / "model"
    t0 = time.perf_counter()
    build_tiny_video(model_dir)
    t_build = time.perf_counter() - t0
    print(f"model: {model_dir} (build/verify {t_build:.1f} s, "
          f"digest {read_build_info(model_dir)['digest'][:16]})", flush=True)

    res = run_once(model_dir)
    res["timing_s"]["build"] = round(t_build, 2)
    for r in res["requests"]:
        print(f"{r['request']:9} prompt_tokens={r['prompt_tokens']} "
              f"num_cached_tokens={r['num_cached_tokens']} token_ids={r['token_ids']} "
              f"{r['seconds']:.3f} s")
    res["verdicts"] = _verdicts({r["request"]: r for r in res["requests"]})
    for what, ok in res["verdicts"].items():
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    print("timing (s): " + ", ".join(f"{k}={v}" for k, v in res["timing_s"].items()))
    if args.json:
        args.json.write_text(json.dumps(res, indent=2))
    if tmp is not None:
        tmp.cleanup()
    return 0 if all(res["verdicts"].values()) else 1


if __name__ == "__main__":
    rc = main()
    # If interpreter teardown ever hangs (vLLM background threads), say where.
    import faulthandler

    faulthandler.dump_traceback_later(60, exit=False)
    sys.exit(rc)
