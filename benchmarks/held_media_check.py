"""Held media on the installed vLLM, end to end: `vlmcache serve` with the tiny
LLaVA-NeXT-Video (a video-only model), one clip asked three times through the `openai`
client. Every answer must be a 200; the report says whether the clip went by identity alone.

    python benchmarks/held_media_check.py --work /tmp/hmc --out held-media-check.json

Written for vLLM 0.26 on a lent GPU, whose parser fails on a video named by uuid alone
(a 500 before the fix of 2026-11-29): there the front sends videos in full. (Images by
identity alone on 0.26 are in ``results/serve-gpu.json``'s ``held_media`` counts.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import openai

from vlmcache.testing.clips import synthetic_frames, video_data_url, write_clip
from vlmcache.testing.server import ServerProcess
from vlmcache.testing.tiny_video import build_tiny_video


def _ask(client: openai.OpenAI, model: str, part: dict, question: str) -> dict:
    t0 = time.perf_counter()
    try:
        resp = client.chat.completions.create(
            model=model, temperature=0, max_tokens=4, extra_body={"cache_salt": "check"},
            messages=[{"role": "user", "content": [part, {"type": "text", "text": question}]}])
    except openai.APIStatusError as exc:
        return {"status": exc.status_code, "error": str(exc)[:300]}
    report = resp.model_extra["vlmcache"]
    return {"status": 200, "ms": round((time.perf_counter() - t0) * 1000, 1),
            "held_media": report.get("held_media"), "hit_tier": report.get("hit_tier")}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", required=True)
    p.add_argument("--out", required=True)
    args = p.parse_args()
    import vllm

    from vlmcache.vllm.compat import null_media_kinds

    work = Path(args.work)
    model = Path(build_tiny_video(work / "model"))
    server = ServerProcess(model, {"store_path": str(work / "store"), "block_size": 32},
                           work / "server.log", vllm_args=[
                               "--media-io-kwargs", '{"video": {"num_frames": 8}}'])
    started = time.perf_counter()
    server.start()
    try:
        client = openai.OpenAI(base_url=server.url + "/v1", api_key="u", max_retries=0)
        video = {"type": "video_url", "video_url": {"url": video_data_url(
            write_clip(None, synthetic_frames(3, n=8), 4.0, "ffv1"), "video/x-msvideo")}}
        rows = {"video": [_ask(client, str(model), video, q) for q in
                          ("What moves?", "Which way does it move?", "How fast?")]}
    finally:
        server.stop()
    result = {"command": "python benchmarks/held_media_check.py " + " ".join(sys.argv[1:]),
              "vllm_version": vllm.__version__, "null_media_kinds": list(null_media_kinds()),
              "server_start_s": round(time.perf_counter() - started, 1), "rows": rows,
              "all_answered": all(r["status"] == 200 for rs in rows.values() for r in rs)}
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=1))
    return 0 if result["all_answered"] else 1


if __name__ == "__main__":
    sys.exit(main())
