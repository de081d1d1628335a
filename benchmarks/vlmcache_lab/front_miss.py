"""What a miss costs the front itself, in process (no HTTP, an instant answer).

The front (``CascadeFront``, the image tier on, optionally the paraphrase tiers) is
primed with 32 requests, then sent ``--requests`` new images, each answered at once and
recorded as in a server (the recorder thread). Per stage the mean milliseconds
(``decode``, ``wait_records``, ``cascade``, ...): ``cascade`` is the lookup a request
waits for; ``wait_records`` is read-your-writes, the previous request's record, which
in a server overlaps the engine's time and here, with no engine time, does not.

    python benchmarks/front_miss.py --questions unique --paraphrase on --out front-miss.json
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Sequence

from vlmcache_lab.front_capacity import tier_bodies

ANSWER = {"id": "x", "object": "chat.completion", "created": 0, "model": "m",
          "choices": [{"index": 0, "finish_reason": "stop",
                       "message": {"role": "assistant", "content": "a blue circle"}}],
          "usage": {"prompt_tokens": 200, "completion_tokens": 4, "total_tokens": 204}}
WORDS = ("red", "blue", "green", "small", "large", "round", "square", "bright", "dark", "left")


def miss_bodies(model: str, n: int, unique_questions: bool) -> list[dict[str, Any]]:
    """``n`` requests on new images; with ``unique_questions`` each asks its own question."""
    bodies = tier_bodies("miss", model, 0, n, 0)
    if unique_questions:
        for k, body in enumerate(bodies):
            for part in body["messages"][0]["content"]:
                if part["type"] == "text":
                    part["text"] = (f"Is the {WORDS[k % 10]} object number {k} near the "
                                    f"{WORDS[(k // 10) % 10]} edge?")
    return bodies


def measure(model: str, requests: int, unique_questions: bool,
            paraphrase: bool) -> dict[str, Any]:
    from vlmcache.config import VlmCacheConfig
    from vlmcache.serving.front import CascadeFront

    config = VlmCacheConfig(store_path=tempfile.mkdtemp(prefix="front-miss-"),
                            model_revision="dummy-weights", enable_image_embedding=True,
                            enable_semantic_text=paraphrase, log_requests=False)
    front = CascadeFront.for_model(model, config, metrics=None)
    try:
        for body in tier_bodies("response", model, 0, 32, 0):
            front.finish(front.begin("chat", json.dumps(body).encode(), {}), 200, ANSWER)
        front.drain()
        raw = [json.dumps(b).encode() for b in miss_bodies(model, requests, unique_questions)]
        stages: dict[str, float] = {}
        started = time.perf_counter()
        for body in raw:
            plan = front.begin("chat", body, {})
            front.finish(plan, 200, ANSWER)
            for stage, seconds in plan.stages.items():
                stages[stage] = stages.get(stage, 0.0) + seconds
        wall = time.perf_counter() - started
    finally:
        front.close()
    return {"requests": requests, "per_request_ms": round(wall / requests * 1e3, 2),
            "stages_ms": {k: round(v / requests * 1e3, 2) for k, v in stages.items()}}


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="benchmarks/geometries/qwen2vl7b")
    p.add_argument("--requests", type=int, default=200)
    p.add_argument("--questions", choices=("fixed", "unique"), default="fixed",
                   help="fixed: the trace's 8 questions; unique: a new question each")
    p.add_argument("--paraphrase", choices=("on", "off"), default="off")
    p.add_argument("--out", default="front-miss.json")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    result = {"command": "python benchmarks/front_miss.py " + " ".join(argv),
              "device": f"{platform.machine()}, {os.cpu_count()} cores",
              "questions": args.questions, "paraphrase": args.paraphrase,
              **measure(args.model, args.requests, args.questions == "unique",
                        args.paraphrase == "on")}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result))
    return 0
