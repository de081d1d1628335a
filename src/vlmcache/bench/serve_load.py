"""Serving load benchmark: many concurrent OpenAI clients against ``vlmcache serve``.

Starts one real server (:class:`ServerProcess`: ``vlmcache serve`` on loopback, vLLM's
default process layout) on the trained tiny-vqa model, then replays a mixed request list
from ``concurrency`` clients: first asks, exact repeats, spacing/case variants,
paraphrases (held-out rewordings), near-duplicate images (JPEG re-encodes) and a second
tenant. Per request it records the status, end-to-end latency, the deciding tier and the
front's time per stage (``vlmcache.front_ms``); the summary has per-tier hit counts, the
front's overhead on a miss (p50 per stage) and response-tier hit latencies.

    python benchmarks/serve.py --requests 1200 --concurrency 16 --out benchmarks/results/serve.json
"""

from __future__ import annotations

import asyncio
import base64
import io
import os
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from vlmcache.tenant_secret import SALT_ENV

HEALTH_TIMEOUT_S = 600.0


class ServerProcess:
    """``vlmcache serve MODEL`` in a subprocess on a free loopback port (its own group)."""

    def __init__(self, model: Path, config: dict[str, object], log_path: Path,
                 vllm_args: Sequence[str] = ()) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        config = dict(config)
        salt = config.pop("tenant_salt", None)  # a secret: in the environment, not in argv
        self.salt_env = {SALT_ENV: str(salt)} if salt else {}
        sets = [a for k, v in config.items() for a in ("--vlmcache-set", f"{k}={_yaml(v)}")]
        self.argv = [sys.executable, "-m", "vlmcache.cli", "serve", str(model), *sets,
                     "--host", "127.0.0.1", "--port", str(self.port), "--enforce-eager",
                     "--max-model-len", "1024", "--gpu-memory-utilization", "0.3",
                     *vllm_args]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> "ServerProcess":
        env = {**os.environ, **self.salt_env, "VLLM_CPU_KVCACHE_SPACE": os.environ.get(
            "VLLM_CPU_KVCACHE_SPACE", "1")}
        log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(self.argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                     start_new_session=True)
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_healthy(self) -> None:
        import httpx

        deadline = time.monotonic() + HEALTH_TIMEOUT_S
        while time.monotonic() < deadline:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited ({self.proc.returncode}):\n{self.log()[-6000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(1.0)
        raise RuntimeError(f"server not healthy after {HEALTH_TIMEOUT_S}s:\n{self.log()[-6000:]}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self._remove_shared_regions()

    def _remove_shared_regions(self) -> None:
        """vLLM-CPU 0.32 leaves its KV offloading region (``/dev/shm/vllm_offload_*.mmap``,
        ``memory_budget`` bytes of RAM) behind when its server is stopped: remove the ones
        this server's log says it created."""
        for match in re.finditer(r"Created mmap file (/dev/shm/vllm_offload_[\w-]+\.mmap)",
                                 self.log()):
            Path(match.group(1)).unlink(missing_ok=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _yaml(value: object) -> str:
    import json

    return json.dumps(value) if not isinstance(value, str) else value


def data_url(image: Any, fmt: str = "PNG", quality: int = 90) -> str:
    buf = io.BytesIO()
    image.convert("RGB").save(buf, format=fmt, **({"quality": quality} if fmt == "JPEG" else {}))
    return f"data:image/{fmt.lower()};base64," + base64.b64encode(buf.getvalue()).decode()


@dataclass(frozen=True)
class LoadRequest:
    """One request of the mix: its kind, tenant, question and image (as a data URL)."""

    kind: str
    tenant: str
    question: str
    image_url: str

    def body(self, model: str) -> dict[str, object]:
        return {"model": model, "temperature": 0, "max_tokens": 4, "cache_salt": self.tenant,
                "messages": [{"role": "user", "content": [
                    {"type": "image_url", "image_url": {"url": self.image_url}},
                    {"type": "text", "text": self.question}]}]}


def build_mix(n: int, seed: int = 0, pool: int = 60) -> list[LoadRequest]:
    """``n`` requests over ``pool`` easy-vqa questions, in a shuffled but causal order:
    each variant of a pair comes after the pair was first asked."""
    from PIL import Image

    from vlmcache.bench.datasets import load_easy_vqa
    from vlmcache.models.paraphrases import paraphrase

    rng = np.random.default_rng(seed)
    samples = load_easy_vqa("test", limit=pool * 4)[::4][:pool]
    firsts = [LoadRequest("first", "tenant-a", s.question,
                          data_url(Image.open(s.image_path))) for s in samples]
    out = list(firsts)
    kinds = ("repeat", "spacing", "paraphrase", "near_duplicate", "other_tenant")
    weights = (0.45, 0.15, 0.15, 0.15, 0.10)
    while len(out) < n:
        k = int(rng.integers(len(samples)))
        s, first = samples[k], firsts[k]
        kind = kinds[int(rng.choice(len(kinds), p=weights))]
        if kind == "repeat":
            out.append(LoadRequest(kind, first.tenant, first.question, first.image_url))
        elif kind == "spacing":
            out.append(LoadRequest(kind, first.tenant, "  " + s.question.capitalize() + " ",
                                   first.image_url))
        elif kind == "paraphrase":
            out.append(LoadRequest(kind, first.tenant, paraphrase(s.question, int(rng.integers(4))),
                                   first.image_url))
        elif kind == "near_duplicate":
            out.append(LoadRequest(kind, first.tenant, s.question,
                                   data_url(Image.open(s.image_path), "JPEG", 90)))
        else:
            out.append(LoadRequest(kind, "tenant-b", s.question, first.image_url))
    head, tail = out[:len(samples)], out[len(samples):]
    rng.shuffle(tail)  # type: ignore[arg-type]
    return head + tail


async def _client(url: str, model: str, queue: "asyncio.Queue[tuple[int, LoadRequest]]",
                  rows: list[dict[str, Any]]) -> None:
    import httpx

    async with httpx.AsyncClient(base_url=url, timeout=300) as client:
        while True:
            try:
                i, req = queue.get_nowait()
            except asyncio.QueueEmpty:
                return
            t0 = time.perf_counter()
            try:
                resp = await client.post("/v1/chat/completions", json=req.body(model))
                status, body = resp.status_code, resp.json()
            except Exception as exc:  # counted as an error, never hidden
                status, body = -1, {"error": repr(exc)}
            rows.append({"i": i, "kind": req.kind, "tenant": req.tenant, "status": status,
                         "e2e_ms": (time.perf_counter() - t0) * 1000,
                         "report": body.get("vlmcache") if isinstance(body, dict) else None,
                         "answer": _answer(body)})


def _answer(body: Any) -> str | None:
    try:
        return str(body["choices"][0]["message"]["content"])
    except (KeyError, IndexError, TypeError):
        return None


async def run_load(url: str, model: str, requests: Sequence[LoadRequest],
                   concurrency: int, warm: int) -> list[dict[str, Any]]:
    """Send the first ``warm`` requests (the first asks) one by one, the rest from
    ``concurrency`` clients at once."""
    rows: list[dict[str, Any]] = []
    for stage in (list(enumerate(requests))[:warm], list(enumerate(requests))[warm:]):
        queue: asyncio.Queue[tuple[int, LoadRequest]] = asyncio.Queue()
        for item in stage:
            queue.put_nowait(item)
        workers = 1 if stage and stage[0][0] == 0 else concurrency
        await asyncio.gather(*(_client(url, model, queue, rows) for _ in range(workers)))
    return sorted(rows, key=lambda r: r["i"])


def probe(url: str, model: str, requests: Sequence[LoadRequest], n: int,
          kind: str) -> list[dict[str, Any]]:
    """Send ``n`` requests one at a time (one client, one kept-alive connection)."""
    import httpx

    rows = []
    with httpx.Client(base_url=url, timeout=300) as client:
        for i in range(n):
            req = requests[i % len(requests)]
            t0 = time.perf_counter()
            resp = client.post("/v1/chat/completions", json=req.body(model))
            rows.append({"i": i, "kind": kind, "tenant": req.tenant,
                         "status": resp.status_code,
                         "e2e_ms": (time.perf_counter() - t0) * 1000,
                         "report": resp.json().get("vlmcache"), "answer": None})
    return rows


def probe_requests(pool: int, n: int) -> list[LoadRequest]:
    """Unseen questions for a tenant no load request used: every tier misses."""
    from PIL import Image

    from vlmcache.bench.datasets import load_easy_vqa

    samples = load_easy_vqa("test", limit=(pool + n) * 4)[pool * 4::4][:n]
    return [LoadRequest("probe_miss", "tenant-probe", s.question,
                        data_url(Image.open(s.image_path))) for s in samples]


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """Errors, per-tier hit counts, miss overhead per stage, response-hit latencies."""
    ok = [r for r in rows if r["status"] == 200 and r["report"]]
    hits: dict[str, int] = {}
    for r in ok:
        tier = r["report"].get("hit_tier") or "miss"
        hits[tier] = hits.get(tier, 0) + 1
    misses = [r for r in ok if not r["report"].get("hit_tier")]
    stages = sorted({k for r in misses for k in (r["report"].get("front_ms") or {})})
    overhead = {k: _p50([r["report"]["front_ms"][k] for r in misses
                         if k in r["report"]["front_ms"]]) for k in stages}
    overhead["total"] = _p50([sum(r["report"]["front_ms"].values()) for r in misses])
    resp = [r for r in ok if r["report"].get("hit_tier") == "response"]
    by_kind: dict[str, dict[str, int]] = {}
    for r in ok:
        tier = r["report"].get("hit_tier") or "miss"
        by_kind.setdefault(r["kind"], {}).setdefault(tier, 0)
        by_kind[r["kind"]][tier] += 1
    return {"requests": len(rows), "errors": len(rows) - len(ok), "hits_by_tier": hits,
            "hits_by_kind": by_kind, "miss_overhead_ms_p50": overhead,
            "response_hit_ms_p50": {
                "server": _p50([r["report"]["latency_s"] * 1000 for r in resp]),
                "end_to_end": _p50([r["e2e_ms"] for r in resp])},
            "miss_e2e_ms_p50": _p50([r["e2e_ms"] for r in misses])}


def idle_summary(hits: Sequence[dict[str, Any]],
                 misses: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The headline latencies, from the one-client probes after the load; the figures
    under load move to ``*_under_load``."""
    miss, hit = summarize(misses), summarize(hits)
    return {"miss_overhead_ms_p50": miss["miss_overhead_ms_p50"],
            "miss_e2e_ms_p50": miss["miss_e2e_ms_p50"],
            "response_hit_ms_p50": hit["response_hit_ms_p50"],
            "probes": {"hits_sent": len(hits), "hit_tiers": hit["hits_by_tier"],
                       "misses_sent": len(misses), "miss_tiers": miss["hits_by_tier"],
                       "errors": hit["errors"] + miss["errors"]}}


def _with_load_figures(load: dict[str, Any]) -> dict[str, Any]:
    """The load's latency figures renamed ``*_under_load`` (the probes give the headline)."""
    for key in ("miss_overhead_ms_p50", "miss_e2e_ms_p50", "response_hit_ms_p50"):
        load[key + "_under_load"] = load.pop(key)
    return load


def _p50(values: Sequence[float]) -> float | None:
    return round(float(np.percentile(values, 50)), 4) if values else None


SERVER_CONFIG: dict[str, object] = {"block_size": 32, "enable_semantic_text": True,
                                    "enable_image_embedding": True, "log_requests": False,
                                    "memory_budget": "512MiB"}


def main(argv: Sequence[str] | None = None) -> int:
    """``python benchmarks/serve.py``: start the server, replay the mix, write the JSON."""
    import argparse
    import json
    import platform
    import tempfile

    from vlmcache.models.tiny_vqa import build_tiny_vqa

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=1200)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--pool", type=int, default=60, help="distinct first questions")
    p.add_argument("--probes", type=int, default=200,
                   help="response-tier hits sent one at a time after the load")
    p.add_argument("--out", default="benchmarks/results/serve.json")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="vlmcache-serve-bench-"))
    model = build_tiny_vqa(work / "tiny-vqa")
    config = {**SERVER_CONFIG, "store_path": str(work / "store")}
    server = ServerProcess(Path(model), config, work / "server.log").start()
    try:
        mix = build_mix(args.requests, pool=args.pool)
        t0 = time.perf_counter()
        rows = asyncio.run(run_load(server.url, str(model), mix, args.concurrency, args.pool))
        wall = time.perf_counter() - t0
        # idle probes, one client: response-tier hits (the first asks, all answered by now)
        # and fresh misses (a new tenant: every tier looks up and misses)
        hits = probe(server.url, str(model), mix[:args.pool], args.probes, "probe_hit")
        misses = probe(server.url, str(model), probe_requests(args.pool, 30), 30,
                       "probe_miss")
    finally:
        server.stop()
    result = {"command": "python benchmarks/serve.py " + " ".join(
        sys.argv[1:] if argv is None else argv),
        "device": f"CPU only ({os.cpu_count()} cores, {platform.processor() or platform.machine()})"
                  f", vLLM-CPU, tiny-vqa, one `vlmcache serve` process layout (API server, "
                  "EngineCore, worker), loopback HTTP",
        "concurrency": args.concurrency, "server_config": config, "wall_s": round(wall, 2),
        **_with_load_figures(summarize(rows)), **idle_summary(hits, misses)}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "server_config"}, indent=2))
    return 0 if result["errors"] == 0 else 1
