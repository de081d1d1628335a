"""What a first sight of a clip costs the front, without an engine: decode (vLLM's loader,
the pixel hash, the thumbnails as the code at hand makes them) and the near-duplicate
lookup against the clips seen before it, then the record (off the request's path in the
server: timed apart).

    python benchmarks/video_front.py --clips 8 --frames 60 --size 224 --out video-front.json

Each clip is new (another synthetic scene), so every lookup is a miss with every earlier
clip of the same sampling as a candidate: the request-path cost the video miss target
(issue 34) is about. Repeats run the whole sequence again on a fresh tier; per clip the
fastest repeat is kept (this machine's other load only adds).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import numpy as np


def clip_urls(clips: int, frames: int, size: int) -> list[str]:
    """``clips`` new clips (mp4v, 2 fps, every other source frame sampled)."""
    from vlmcache.testing.clips import synthetic_frames, video_data_url, write_clip

    return [video_data_url(write_clip(None, synthetic_frames(100 + k, n=2 * frames, h=size,
                                                             w=size), codec="mp4v", fps=2.0))
            for k in range(clips)]


def one_pass(urls: Sequence[str], frames: int) -> list[dict[str, float]]:
    """Per clip: decode, lookup and record times (ms) on a fresh tier."""
    from vlmcache.serving.videos import VideoLimits, decode_video_url
    from vlmcache.tiers.video import VideoQuery, VideoTier
    from vlmcache.vllm.video_io import VideoSampling, video_kwargs

    sampling = VideoSampling({"video": {"num_frames": frames}}, None)
    limits = VideoLimits(64 << 20, 256, 1920 * 1080, 900.0, "refuse", 5.0)
    kwargs = video_kwargs(sampling, None)
    tier, out = VideoTier(0.19, 1 << 30), []
    for url in urls:
        t0 = time.perf_counter()
        video = decode_video_url(url, "video", limits, sampling, kwargs, None)
        query = VideoQuery(video.content_hash, video.signature, video.thumbs, url)
        t1 = time.perf_counter()
        match = tier.lookup(query, "t")
        t2 = time.perf_counter()
        tier.record(query, "t")
        t3 = time.perf_counter()
        out.append({"decode_ms": (t1 - t0) * 1e3, "lookup_ms": (t2 - t1) * 1e3,
                    "record_ms": (t3 - t2) * 1e3, "hit": match is not None})
    return out


def _commit() -> str:
    import vlmcache

    src = Path(vlmcache.__file__).resolve().parents[2]
    try:
        return subprocess.run(["git", "-C", str(src), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "?"


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--clips", type=int, default=8)
    p.add_argument("--frames", type=int, default=60, help="frames the sampling takes")
    p.add_argument("--size", type=int, default=224, help="frame side, px")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="video-front.json")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    urls = clip_urls(args.clips, args.frames, args.size)
    passes = [one_pass(urls, args.frames) for _ in range(args.repeats)]
    best = [{k: min(p[i][k] for p in passes) for k in ("decode_ms", "lookup_ms", "record_ms")}
            for i in range(args.clips)]
    later = best[1:] or best  # the first clip has no candidate
    summary = {k: round(float(np.median([b[k] for b in later])), 2)
               for k in ("decode_ms", "lookup_ms", "record_ms")}
    summary["request_path_ms"] = round(summary["decode_ms"] + summary["lookup_ms"], 2)
    result = {"command": "python benchmarks/video_front.py " + " ".join(argv),
              "code": _commit(), "device": f"{platform.machine()}, {os.cpu_count()} cores",
              "clips": args.clips, "frames": args.frames, "size": args.size,
              "hits": sum(b["hit"] for p in passes for b in p),
              "median_after_the_first_clip": summary,
              "per_clip_best": [{k: round(v, 2) for k, v in b.items()} for b in best]}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(summary))
    return 0
