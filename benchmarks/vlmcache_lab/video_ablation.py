"""Which tier costs what on a video request: ``vlmcache serve`` with its KV and encoder
tiers on and off, beside plain vLLM's server (the tiny LLaVA-NeXT-Video, CPU).

Per server, one after the other: ``--clips`` clips, each asked three questions
(``miss``, then ``followup`` and ``third``: both find the clip's prompt in vLLM's prefix
cache), unstreamed, one request at a time; p50 end-to-end per phase over the clips after
the first (the first pays first-request costs). ``front_followup``: the front's own time on
a follow-up (vlmcache's report), so what is left of a difference is the engine's.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from vlmcache_lab import video_serve as vs

#: The servers compared: ``None`` is plain vLLM, a dict is ``vlmcache serve`` with it.
VARIANTS: dict[str, dict[str, object] | None] = {
    "plain": None,
    "ours": {},
    "ours_no_encoder_tier": {"enable_encoder_cache": False},
    "ours_no_kv_tiers": {"enable_kv_save": False, "enable_kv_load": False},
    "ours_no_kv_no_encoder": {"enable_encoder_cache": False, "enable_kv_save": False,
                              "enable_kv_load": False},
}
PHASES = (("miss", "what is moving?"), ("followup", "which shape is largest?"),
          ("third", "how many shapes?"))


def summarize(rows: dict[str, list[dict[str, Any]]]) -> dict[str, float]:
    """p50 e2e per phase over the clips after the first, and the front's share."""
    out = {ph: round(statistics.median(r["e2e_ms"] for r in rs[1:]), 1)
           for ph, rs in rows.items()}
    fronts = [sum(((r["report"] or {}).get("front_ms") or {}).values())
              for r in rows["followup"][1:]]
    out["front_followup"] = round(statistics.median(fronts), 1)
    return out


def run_variant(name: str, extra: dict[str, object] | None, args: Any,
                work: Path) -> dict[str, float]:
    (work / name).mkdir(parents=True, exist_ok=True)
    server = vs.make_server("plain" if extra is None else "ours", args, work / name, name,
                            {"log_requests": False, **(extra or {})})
    server.start()
    try:
        rows: dict[str, list[dict[str, Any]]] = {ph: [] for ph, _ in PHASES}
        for k in range(args.clips):
            frames = vs.synthetic_frames(2000 + k, n=2 * args.frames, h=args.size, w=args.size)
            clip = vs.write_clip(None, frames, 4.0, "mp4v")
            for phase, question in PHASES:
                rows[phase].append(vs.ask(server.url, vs.body(args, clip, "mp4v", question,
                                                              "acme", stream=False)))
        return summarize(rows)
    finally:
        server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    args = vs.parse_args(argv)
    work = Path(args.work)
    if args.model is None:
        from vlmcache.testing.tiny_video import build_tiny_video

        args.model = str(build_tiny_video(work / "model"))
    result: dict[str, Any] = {"command": "python benchmarks/video_ablation.py " + " ".join(
        sys.argv[1:] if argv is None else argv), "device": vs._device(),
        "measured": time.strftime("%Y-%m-%d"), "clips": args.clips, "variants": {}}
    for name, extra in VARIANTS.items():
        result["variants"][name] = {"config": extra, **run_variant(name, extra, args, work)}
        print(name, result["variants"][name], flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    return 0
