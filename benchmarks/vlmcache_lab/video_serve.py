"""Video through ``vlmcache serve`` beside plain vLLM's OpenAI server, the same vLLM flags.

Turns (``--turns``): ``sequential`` runs one server at a time (plain first, then ours, each
started, measured, restarted on its own store, measured again, stopped), for a CPU where both
cannot run at once without taking each other's cores; ``paired`` starts both at once (on a
GPU, each with its share of memory) and sends every request to both, back to back, the first
server alternating request by request, so a drift of the machine over minutes falls on both
arms alike (``paired_ratios``: the median of the per-request ratios). Streamed requests one
at a time (latency, not load):

- ``miss``: a clip asked for the first time (``--clips`` clips, mp4v);
- ``reencoded``: the same clip re-encoded by another codec (MJPG), the same question;
- ``stream``: a live feed: the last ``--frames`` frames every request, the window moving
  by ``--step`` frames, sent as one video;
- ``followup``: a second question on each clip, before the restart (both servers' prefix
  caches hold the clip; vlmcache's second-sight admission captures its KV now, since a
  one-off prompt's blocks are never copied out);
- ``restart_followup``: after a restart on the same store, a third question on each clip.

Each row keeps what the server said it reused (vlmcache's report; plain vLLM's
``prompt_tokens_details.cached_tokens``); per phase and server, ``engine`` is vLLM's own
view from ``/metrics`` (TTFT, queue and prefill means) and, for ours, what became of the
front's decodes (``video_handoff``: kept / taken by vLLM's loader / decoded again). Frames reused per stream request are the cached
prompt tokens past the text before the video, in whole frames of the model's tokens.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from vlmcache.testing.clips import synthetic_frames, write_clip
from vlmcache.testing.server import ServerProcess
from vlmcache_lab.engine_metrics import phase_means, scrape
from vlmcache_lab.serve_gpu_servers import start_servers, stop_servers
from vlmcache_lab.video_requests import ask, body

QUESTION = "what is moving in the video?"
FOLLOW_UP_FIRST = "how many shapes are there?"
FOLLOW_UP = "which shape moves fastest?"
STREAM_Q = "what changed in the last seconds?"
#: phases whose engine view (``/metrics`` before and after) the result keeps
ENGINE_PHASES = ("miss", "reencoded", "followup")
# encoder_cache_v1_runner: the encoder-output tier is what issue 34 measures after a
# restart; on vLLM 0.26's GPUs wiring it runs ours' engine on vLLM's V1 model runner (plain
# keeps its default V2), which the product's default avoids by leaving the tier out there
OURS_CONFIG: dict[str, object] = {"log_requests": False, "enable_video_near_duplicates": True,
                                  "encoder_cache_v1_runner": True}


def vllm_flags(args: Any) -> list[str]:
    """The vLLM flags both servers get (ServerProcess adds --enforce-eager)."""
    flags = ["--enable-prefix-caching", "--enable-prompt-tokens-details",
             "--max-model-len", str(args.max_model_len),
             "--media-io-kwargs", json.dumps({"video": {"num_frames": args.frames}})]
    if args.dummy_weights:
        flags += ["--load-format", "dummy"]
    if args.gpu_memory_utilization:
        flags += ["--gpu-memory-utilization", str(args.gpu_memory_utilization)]
    if args.max_num_batched_tokens:  # also vLLM's encoder cache size: a whole clip must fit
        flags += ["--max-num-batched-tokens", str(args.max_num_batched_tokens)]
    return flags


def make_server(kind: str, args: Any, work: Path, name: str,
                ours_config: dict[str, object] | None = None) -> ServerProcess:
    """``vlmcache serve`` (``ours``, with ``ours_config``, default :data:`OURS_CONFIG`) or
    plain vLLM's server, not started."""
    base = OURS_CONFIG if ours_config is None else ours_config
    config = {**base, **json.loads(getattr(args, "ours_config", None) or "{}"),
              "store_path": str(work / "store")}
    if args.dummy_weights:
        config["model_revision"] = "dummy-weights"
    server = ServerProcess(Path(args.model), config, work / f"{name}.log", vllm_flags(args))
    if kind == "plain":
        server.argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                       "--model", args.model, "--host", "127.0.0.1",
                       "--port", str(server.port), *server.argv[server.argv.index(
                           "--enforce-eager"):]]
    return server


def clips(args: Any) -> list[np.ndarray]:
    """The clips asked about (seeded; frames 2x the sampling, so sampling skips some)."""
    return [synthetic_frames(1000 + k, n=2 * args.frames, h=args.size, w=args.size)
            for k in range(args.clips)]


def turn_order(i: int, kinds: Sequence[str]) -> list[str]:
    """Which server gets request ``i`` first: alternating, so neither arm always follows the
    other's request."""
    return list(kinds) if i % 2 == 0 else list(reversed(kinds))


def phase(urls: dict[str, str], payloads: Sequence[dict[str, Any]],
          engine: dict[str, Any] | None = None) -> dict[str, list[dict[str, Any]]]:
    """Every payload to every server, in :func:`turn_order`; each server's rows in payload
    order. ``engine``: filled per server with the engine's own view of the phase (vLLM's
    TTFT / queue / prefill means, the front's video handoff outcomes) from ``/metrics``."""
    before = {kind: scrape(url) for kind, url in urls.items()} if engine is not None else {}
    rows: dict[str, list[dict[str, Any]]] = {kind: [] for kind in urls}
    for i, payload in enumerate(payloads):
        for kind in turn_order(i, list(urls)):
            rows[kind].append(ask(urls[kind], payload))
    if engine is not None:
        for kind, url in urls.items():
            engine[kind] = phase_means(before[kind], scrape(url))
    return rows


def _asks(args: Any, codec: str, question: str, stream: bool = True) -> list[dict[str, Any]]:
    return [body(args, write_clip(None, frames, 4.0, codec), codec, question, "acme", stream)
            for frames in clips(args)]


def _warm_up(urls: dict[str, str], args: Any, seeds: Sequence[int]) -> None:
    phase(urls, [body(args, write_clip(None, synthetic_frames(
        seed, n=2 * args.frames, h=args.size, w=args.size), 4.0, "mp4v"), "mp4v",
        "warm up?", "warm") for seed in seeds])


def measure_first(urls: dict[str, str], args: Any) -> dict[str, dict[str, Any]]:
    """Warm-up (first-request costs out of the measured rows), misses, re-encoded copies,
    follow-ups and the stream, on started servers; per server, its rows per phase."""
    _warm_up(urls, args, (9000, 9001))
    engine: dict[str, dict[str, Any]] = {name: {} for name in ENGINE_PHASES}
    phases = {"miss": phase(urls, _asks(args, "mp4v", QUESTION), engine["miss"]),
              "reencoded": phase(urls, _asks(args, "mjpg", QUESTION), engine["reencoded"]),
              "followup": phase(urls, _asks(args, "mp4v", FOLLOW_UP_FIRST, stream=False),
                                engine["followup"]),
              "stream": phase(urls, stream_payloads(args))}
    return {kind: {**{name: rows[kind] for name, rows in phases.items()},
                   "engine": {name: engine[name].get(kind) for name in ENGINE_PHASES}}
            for kind in urls}


def stream_payloads(args: Any) -> list[dict[str, Any]]:
    """A live feed: the last ``frames`` frames, the window moving by ``step``."""
    total = args.frames + args.step * (args.stream_requests - 1)
    feed = synthetic_frames(777, n=total, h=args.size, w=args.size)
    # 2 fps: as long as the asked clips (2x the frames at 4 fps), every frame sampled
    return [body(args, write_clip(None, feed[r * args.step:r * args.step + args.frames], 2.0,
                                  "mp4v"), "mp4v", STREAM_Q, "acme")
            for r in range(args.stream_requests)]


def measure_restart(urls: dict[str, str], args: Any) -> dict[str, list[dict[str, Any]]]:
    """After a restart: warm-up on other clips, then a follow-up on each clip."""
    _warm_up(urls, args, (9100,))
    return phase(urls, _asks(args, "mp4v", FOLLOW_UP, stream=False))


def run_servers(kinds: Sequence[str], args: Any, work: Path) -> dict[str, dict[str, Any]]:
    """The rows of ``kinds``' servers, run at once: start, measure, restart each on its own
    store, measure, stop."""
    for kind in kinds:
        (work / kind).mkdir(parents=True, exist_ok=True)
    servers = {kind: make_server(kind, args, work / kind, "first") for kind in kinds}
    start_servers(servers)
    try:
        rows = measure_first({kind: s.url for kind, s in servers.items()}, args)
        time.sleep(args.settle_s)  # the store writes behind the requests (disk_write: async)
    finally:
        stop_servers(servers)
    servers = {kind: make_server(kind, args, work / kind, "restarted") for kind in kinds}
    start_servers(servers)
    try:
        restart = measure_restart({kind: s.url for kind, s in servers.items()}, args)
    finally:
        stop_servers(servers)
    for kind in kinds:
        rows[kind]["restart_followup"] = restart[kind]
    return rows


def run_turns(args: Any, work: Path) -> dict[str, dict[str, Any]]:
    """Both servers' rows in ``--turns``' layout."""
    if args.turns == "paired":
        return run_servers(("plain", "ours"), args, work)
    return {kind: run_servers((kind,), args, work)[kind] for kind in ("plain", "ours")}


def paired_ratios(rows: dict[str, dict[str, Any]]) -> dict[str, float]:
    """Per phase, the median of ours' e2e over plain's on the same request (``paired``
    turns: the two were asked back to back)."""
    return {f"{name}_ms": round(statistics.median(
        o["e2e_ms"] / p["e2e_ms"] for o, p in zip(rows["ours"][name], rows["plain"][name])), 3)
        for name in ("miss", "reencoded", "followup", "restart_followup")}


def _p50(values: Sequence[float]) -> float:
    return round(statistics.median(values), 2)


def summarize(rows: dict[str, Any], args: Any, tokens_per_frame: int) -> dict[str, Any]:
    """The issue's fields from one server's rows."""
    out: dict[str, Any] = {
        "miss_ms": _p50([r["e2e_ms"] for r in rows["miss"]]),
        "miss_ttft_ms": _p50([r["ttft_ms"] for r in rows["miss"]]),
        "reencoded_ms": _p50([r["e2e_ms"] for r in rows["reencoded"]]),
        "reencoded_ttft_ms": _p50([r["ttft_ms"] for r in rows["reencoded"]]),
        "followup_ms": _p50([r["e2e_ms"] for r in rows["followup"]]),
        "restart_followup_ms": _p50([r["e2e_ms"] for r in rows["restart_followup"]]),
        "reencoded_cached_tokens": [r["cached_tokens"] for r in rows["reencoded"]],
        "restart_cached_tokens": [r["cached_tokens"] for r in rows["restart_followup"]],
        "prompt_tokens": rows["miss"][0]["prompt_tokens"],
        "stream": _stream_summary(rows["stream"], args, tokens_per_frame),
    }
    reports = [r["report"] for r in rows["restart_followup"] if r["report"]]
    if reports:
        out["encoder_outputs_loaded"] = sum(int(r["images_loaded"]) for r in reports)
        out["tokens_loaded"] = sum(int(r["tokens_loaded"]) for r in reports)
        out["reencoded_tiers"] = [(r["report"] or {}).get("hit_tier") for r in rows["reencoded"]]
    if rows.get("engine"):
        out["engine"] = rows["engine"]
    return out


def _stream_summary(rows: Sequence[dict[str, Any]], args: Any,
                    tokens_per_frame: int) -> dict[str, Any]:
    later = rows[1:]  # the first request has nothing before it
    reused = [max(0, r["cached_tokens"] - args.text_before_video) // tokens_per_frame
              for r in later]
    return {"frames_per_request": args.frames, "step": args.step, "requests": len(rows),
            "frames_reused": reused, "ttft_p50_ms": _p50([r["ttft_ms"] for r in later])}


def _image_stream_summary(rows: Sequence[dict[str, Any]], args: Any) -> dict[str, Any]:
    later = rows[1:]
    out: dict[str, Any] = {"frames_per_request": args.image_frames, "step": args.step,
                           "requests": len(rows),
                           "e2e_p50_ms": _p50([r["e2e_ms"] for r in later]),
                           "cached_tokens": [r["cached_tokens"] for r in later]}
    reports = [r["report"] for r in later if r["report"]]
    if reports:
        out["frames_encoded"] = [int(r["images_encoded"]) for r in reports]
        out["frames_reused"] = [args.image_frames - int(r["images_encoded"]) for r in reports]
    return out


def compact_rows(rows: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """Each request's figures (what the summary is computed from), without answers."""
    keep = ("ttft_ms", "e2e_ms", "prompt_tokens", "cached_tokens")
    out = {}
    for phase, phase_rows in rows.items():
        if phase == "engine":  # per phase, the engine's view: kept whole in the summary
            continue
        out[phase] = []
        for r in phase_rows:
            row = {k: round(r[k], 2) if isinstance(r[k], float) else r[k] for k in keep}
            rep = r.get("report") or {}
            row.update({k: rep[k] for k in ("hit_tier", "tokens_loaded", "images_loaded",
                                            "images_encoded", "tokens_from_prefix_cache",
                                            "video_frames", "front_ms", "held_media")
                        if k in rep})
            out[phase].append(row)
    return out


def answers_equal(ours: dict[str, Any], plain: dict[str, Any]) -> dict[str, float]:
    """Share of rows whose answers are the same text, per phase."""
    return {phase: float(np.mean([a["text"] == b["text"] for a, b in
                                  zip(ours[phase], plain[phase])]))
            for phase in ("miss", "reencoded", "followup", "restart_followup")}


def image_stream(kind: str, args: Any, work: Path) -> list[dict[str, Any]]:
    """The same feed sent as ``--image-frames`` PNG images per request to an image model
    (tiny LLaVA): each frame keeps its bytes, so an encoder cache keyed per item can keep
    every frame it has seen. Unstreamed: vlmcache's report says what was encoded."""
    import base64
    import io

    from PIL import Image

    from vlmcache.testing.tiny_llava import build_tiny_llava

    model = str(build_tiny_llava(Path(args.work) / "image-model"))
    total = args.image_frames + args.step * (args.stream_requests - 1)
    feed = synthetic_frames(777, n=total, h=args.size, w=args.size)
    urls = []
    for frame in feed:
        buf = io.BytesIO()
        Image.fromarray(frame).save(buf, format="PNG")
        urls.append("data:image/png;base64," + base64.b64encode(buf.getvalue()).decode())
    img_args = argparse_copy(args, model=model, dummy_weights=False)
    server = make_server(kind, img_args, work, f"images-{kind}")
    server.argv += ["--limit-mm-per-prompt", json.dumps({"image": args.image_frames})]
    server.start()
    try:
        rows = []
        for r in range(args.stream_requests):
            parts = [{"type": "image_url", "image_url": {"url": u}}
                     for u in urls[r * args.step:r * args.step + args.image_frames]]
            payload = {"model": model, "temperature": 0, "max_tokens": args.max_tokens,
                       "cache_salt": "acme", "messages": [{"role": "user", "content": [
                           *parts, {"type": "text", "text": STREAM_Q}]}]}
            rows.append(ask(server.url, payload))
        return rows
    finally:
        server.stop()


def argparse_copy(args: Any, **changes: Any) -> Any:
    """``args`` with some fields changed (argparse namespaces are mutable: copy first)."""
    import argparse

    return argparse.Namespace(**{**vars(args), **changes})


def parse_args(argv: Sequence[str] | None) -> Any:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=None,
                   help="model directory (default: the tiny LLaVA-NeXT-Video, built here)")
    p.add_argument("--shape", default="tiny-llava-next-video-cpu", help="the result's name")
    p.add_argument("--dummy-weights", action="store_true", help="--load-format dummy (GPU)")
    p.add_argument("--frames", type=int, default=16, help="frames the engine samples")
    p.add_argument("--tokens-per-frame", type=int, default=64)
    p.add_argument("--text-before-video", type=int, default=4,
                   help="prompt tokens before the video (chat template)")
    p.add_argument("--step", type=int, default=4, help="frames the stream's window moves")
    p.add_argument("--stream-requests", type=int, default=8)
    p.add_argument("--clips", type=int, default=6)
    p.add_argument("--size", type=int, default=224, help="frame side, px")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--max-num-batched-tokens", type=int, default=None,
                   help="both servers' --max-num-batched-tokens (default: vLLM's)")
    p.add_argument("--gpu-memory-utilization", type=float, default=None,
                   help="both servers' share of GPU memory (default: ServerProcess's 0.3)")
    p.add_argument("--settle-s", type=float, default=10.0,
                   help="seconds the first server idles before its restart (async writes)")
    p.add_argument("--work", default="/tmp/vlmcache-video-bench")
    p.add_argument("--image-frames", type=int, default=4,
                   help="frames per request of the image-stream layout (0: not run)")
    p.add_argument("--turns", choices=("sequential", "paired"), default="sequential",
                   help="one server at a time (a CPU) or both at once, request by request "
                        "(a GPU: give each its --gpu-memory-utilization share)")
    p.add_argument("--ours-config", default="{}",
                   help="JSON merged over ours' config, e.g. '{\"encoder_cache_v1_runner\": "
                        "false}': the product's default on vLLM 0.26's GPUs (no encoder tier, "
                        "vLLM's V2 model runner)")
    p.add_argument("--out", required=True)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    work = Path(args.work)
    if args.model is None:
        from vlmcache.testing.tiny_video import build_tiny_video

        args.model = str(build_tiny_video(work / "model"))
    rows = run_turns(args, work)
    shape = {kind: summarize(r, args, args.tokens_per_frame) for kind, r in rows.items()}
    shape["ratios"] = {k: round(shape["ours"][k] / shape["plain"][k], 3)
                       for k in ("miss_ms", "reencoded_ms", "followup_ms", "restart_followup_ms")}
    if args.turns == "paired":
        shape["paired_ratios"] = paired_ratios(rows)
    shape["answers_equal"] = answers_equal(rows["ours"], rows["plain"])
    if args.image_frames:
        images = {kind: image_stream(kind, args, work / kind) for kind in ("plain", "ours")}
        shape["image_stream"] = {kind: _image_stream_summary(r, args)
                                 for kind, r in images.items()}
    shape["rows"] = {kind: compact_rows(r) for kind, r in rows.items()}
    shape["settings"] = {k: getattr(args, k) for k in (
        "frames", "tokens_per_frame", "step", "stream_requests", "clips", "size", "max_tokens",
        "max_model_len", "max_num_batched_tokens", "dummy_weights", "settle_s", "turns",
        "ours_config")}
    out = Path(args.out)
    result = json.loads(out.read_text()) if out.exists() else {"shapes": {}}
    result["shapes"][args.shape] = {**shape, "command": "python benchmarks/video.py " + " ".join(
        sys.argv[1:] if argv is None else argv), "device": _device(),
        "measured": time.strftime("%Y-%m-%d")}
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: shape[k] for k in ("ratios", "answers_equal")}, indent=1))
    return 0


def _device() -> str:
    import platform

    try:
        import torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return f"CPU ({platform.processor() or platform.machine()}), no GPU"
