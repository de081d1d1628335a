"""What a video body's size costs the front beyond the clip's decode: parsing the JSON,
decoding the data URL's base64 and writing the rewritten body for the engine (the three
steps of ``serving/wire.py``), with the standard library and with the libraries the front
now uses where installed (``pybase64``, ``orjson``).

    python benchmarks/front_body.py --sizes-mb 1,3,10,30 --out front-body.json

Plain vLLM parses and decodes the body once itself; ours' front does it too, before it, so
every millisecond here is added to a miss's time to first token.
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from vlmcache_lab.phase_timing import median_ms

STEPS = ("parse_ms", "base64_ms", "write_ms")


def make_body(size: int) -> bytes:
    """A chat request carrying ``size`` bytes of (random, incompressible) clip."""
    import base64

    url = "data:video/mp4;base64," + base64.b64encode(os.urandom(size)).decode()
    return json.dumps({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": url}},
        {"type": "text", "text": "what is moving in the video?"}]}]}).encode()


def measure(raw: bytes, repeats: int) -> dict[str, float]:
    """The three steps on one body, with the libraries ``wire`` has now."""
    from vlmcache.serving import wire
    from vlmcache.serving.openai_req import load_body

    body = load_body(raw)
    payload = body["messages"][0]["content"][0]["video_url"]["url"].partition(",")[2]
    body["messages"][0]["content"][0]["uuid"] = "0" * 64  # what the rewrite adds
    out = {"parse_ms": median_ms(lambda: load_body(raw), repeats),
           "base64_ms": median_ms(lambda: wire.b64decode(payload), repeats),
           "write_ms": median_ms(lambda: wire.dump_json(body), repeats)}
    out["total_ms"] = round(sum(out[k] for k in STEPS), 3)
    return out


def run(sizes_mb: Sequence[float], repeats: int) -> list[dict[str, Any]]:
    from vlmcache.serving import wire

    fast = (wire._b64, wire._orjson)
    rows = []
    for mb in sizes_mb:
        raw = make_body(int(mb * 1e6))
        row: dict[str, Any] = {"clip_mb": mb, "body_mb": round(len(raw) / 1e6, 2)}
        wire._b64, wire._orjson = None, None
        try:
            row["stdlib"] = measure(raw, repeats)
        finally:
            wire._b64, wire._orjson = fast
        row["now"] = measure(raw, repeats)
        row["saved_ms"] = round(row["stdlib"]["total_ms"] - row["now"]["total_ms"], 2)
        rows.append(row)
    return rows


def main(argv: Sequence[str] | None = None) -> int:
    import argparse

    from vlmcache.serving import wire

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes-mb", default="1,3,10,30")
    p.add_argument("--repeats", type=int, default=15)
    p.add_argument("--out", default="front-body.json")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    rows = run([float(s) for s in args.sizes_mb.split(",")], args.repeats)
    result = {"command": "python benchmarks/front_body.py " + " ".join(argv),
              "device": f"{platform.machine()}, {os.cpu_count()} cores",
              "libraries": {"pybase64": wire._b64 is not None,
                            "orjson": wire._orjson is not None},
              "measured": time.strftime("%Y-%m-%d"), "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for row in rows:
        print(json.dumps(row))
    return 0
