"""``vlmcache`` command line: inspect, verify and clear a store; print a config.

    vlmcache serve  MODEL [--vlmcache-config FILE] [--vlmcache-set KEY=VALUE] [vLLM args]
    vlmcache proxy  MODEL --upstream URL [--upstream URL] [--port 8080] [--routing R]
    vlmcache stats  --store ~/.cache/vlmcache [--server http://host:8000]
    vlmcache verify --store ~/.cache/vlmcache      # reads every chunk, drops corrupt ones
    vlmcache clear  --store ~/.cache/vlmcache --yes
    vlmcache config [--file vlmcache.yaml]         # the effective config, validated
    vlmcache bench  [--dataset easy-vqa] [--modes all] [--out vlmcache-bench]
                                                   # every mode side by side (see bench.run)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Sequence

import vlmcache.cpu_share as cpu_share
from vlmcache.config import VlmCacheConfig
from vlmcache.errors import VlmCacheError
from vlmcache.tenant_secret import MASK, SALT_ENV

#: Opening a store to inspect it must never evict: use a budget nothing reaches.
_INSPECT_BUDGET = 1 << 62


def _store_path(args: argparse.Namespace) -> Path:
    if args.store:
        return Path(args.store).expanduser()
    return VlmCacheConfig().store_dir


def _open_disk(path: Path):
    from vlmcache.store.disk import DiskStore

    kv = path / "kv"
    if not kv.is_dir():
        raise VlmCacheError(f"no vlmcache store at {path} (no {kv})")
    return DiskStore(kv, _INSPECT_BUDGET)


def cmd_stats(args: argparse.Namespace) -> int:
    from vlmcache.serving.stats import server_metrics, store_stats

    report: dict[str, object] = store_stats(_store_path(args))
    if args.server:
        report["server"] = server_metrics(args.server)
    print(json.dumps(report, indent=2) if args.json else _flat(report))
    return 0


def _flat(report: dict[str, object], prefix: str = "") -> str:
    lines = []
    for k, v in report.items():
        if isinstance(v, dict):
            lines.append(_flat(v, f"{prefix}{k}."))
        else:
            lines.append(f"{prefix + k:>32}: {v}")
    return "\n".join(lines)


def _serve_config(args: argparse.Namespace) -> VlmCacheConfig:
    values: dict[str, object] = VlmCacheConfig.from_yaml(args.vlmcache_config).to_dict() \
        if args.vlmcache_config else {}
    for item in args.vlmcache_set or ():
        key, sep, raw = item.partition("=")
        if not sep:
            raise VlmCacheError(f"--vlmcache-set {item!r}: expected KEY=VALUE")
        import yaml

        if key.strip() == "tenant_salt":  # argv is readable by every local user
            raise VlmCacheError(f"--vlmcache-set tenant_salt: a secret never goes on a "
                                f"command line; put it in the environment variable "
                                f"{SALT_ENV}, in a private --vlmcache-config file, or leave "
                                f"it out (the store keeps a random one, 0600)")
        values[key.strip()] = yaml.safe_load(raw)
    return VlmCacheConfig.from_dict(values)


def cmd_serve(args: argparse.Namespace) -> int:
    from vlmcache.api import _device_type
    from vlmcache.serving.launch import run, serve_command

    config = _serve_config(args)
    run_dir = Path(args.run_dir or (config.store_dir / "serve" / str(os.getpid())))
    try:
        command = serve_command(args.model, config, args.vllm_args, _device_type(), run_dir,
                                front=not args.no_front)
    except ValueError as exc:
        raise VlmCacheError(str(exc)) from exc
    if args.print_command:
        env = {k: (MASK if k == SALT_ENV else v) for k, v in command.env.items()}
        print(json.dumps({"argv": command.argv, "env": env}, indent=2))
        return 0
    run(command)
    return 0


def cmd_proxy(args: argparse.Namespace) -> int:
    import uvicorn

    from vlmcache.serving.front import CascadeFront
    from vlmcache.serving.metrics import FrontMetrics
    from vlmcache.serving.proxy import build_proxy_app
    from vlmcache.vllm.logs import LOGGER

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger(LOGGER).setLevel(logging.INFO)
    from vlmcache.serving.launch import parse_media_io_kwargs

    config = _serve_config(args)
    try:
        media_io = parse_media_io_kwargs(args.media_io_kwargs, "--media-io-kwargs")
    except ValueError as exc:
        raise VlmCacheError(str(exc)) from exc
    if args.routing is not None:
        from vlmcache.serving.routing import check_policy

        try:
            check_policy(args.routing)
        except ValueError as exc:
            raise VlmCacheError(f"--{exc}") from exc
    if args.workers is not None:
        config = dataclasses.replace(config, proxy_workers=args.workers)
    if config.proxy_workers > 1:
        from vlmcache.serving.proxy_workers import run_workers

        run_workers(args.model, config, media_io, args.upstream, args.routing, args.host,
                    args.port)
        return 0
    # the proxy's process is the front's own: off the CPUs left to vLLM, as its workers are
    cpu_share.pin_process(cpu_share.plan(config.engine_cpus, config.front_thread_nice))
    front = CascadeFront.for_model(args.model, config, metrics=FrontMetrics.create(
        tenant_label=config.metrics_tenant_label), media_io_kwargs=media_io, own_process=True)
    try:
        app = build_proxy_app(front, args.upstream, routing=args.routing)
        uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    finally:
        front.close()
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    disk = _open_disk(_store_path(args))
    keys = disk.keys()
    bad = [key for key in keys if disk.get(key) is None]
    disk.close()
    print(f"verified {len(keys)} chunks: {len(keys) - len(bad)} good, {len(bad)} corrupt "
          f"(removed)")
    return 1 if bad else 0


def cmd_clear(args: argparse.Namespace) -> int:
    path = _store_path(args)
    if not args.yes:
        print(f"refusing to delete {path} without --yes", file=sys.stderr)
        return 2
    for sub in ("kv", "exact"):
        shutil.rmtree(path / sub, ignore_errors=True)
    print(f"cleared {path}")
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    config = VlmCacheConfig.from_yaml(args.file) if args.file else VlmCacheConfig()
    values = config.to_dict()
    values["tenant_salt"] = MASK if config.tenant_salt else ""  # a secret: never printed
    print(json.dumps(values, indent=2))
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from vlmcache.bench.run import main as bench_main

    return bench_main(args, args.argv)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vlmcache", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func, helptext in (("stats", cmd_stats, "chunk count and bytes of a store"),
                                 ("verify", cmd_verify, "check every chunk's checksum"),
                                 ("clear", cmd_clear, "delete a store's chunks and indexes")):
        p = sub.add_parser(name, help=helptext)
        p.add_argument("--store", help="store directory (default: the config default)")
        p.set_defaults(func=func)
        if name == "stats":
            p.add_argument("--json", action="store_true")
            p.add_argument("--server", help="also read a running server's /metrics "
                           "(e.g. http://127.0.0.1:8000)")
        if name == "clear":
            p.add_argument("--yes", action="store_true", help="really delete")
    _add_serving_parsers(sub)
    p = sub.add_parser("config", help="print the effective, validated config")
    p.add_argument("--file", help="a YAML config file")
    p.set_defaults(func=cmd_config)
    from vlmcache.bench.run import add_arguments

    p = sub.add_parser("bench", help="benchmark every mode side by side on a VQA dataset",
                       description="Replays one request list (zipfian repeats, paraphrases, "
                       "near-duplicate frames, a restart, tenants) through vLLM alone, vLLM's "
                       "offloading and each vlmcache tier; writes JSON, Markdown and a plot.")
    add_arguments(p)
    p.set_defaults(func=cmd_bench)
    return parser


def _add_serving_parsers(sub: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = sub.add_parser("serve", help="vLLM's OpenAI server with vlmcache's front and "
                       "connectors (extra arguments go to vLLM)")
    p.add_argument("model", help="a local model directory")
    _front_args(p)
    p.add_argument("--vlmcache-run-dir", dest="run_dir",
                   help="where the front's config and logging config are written")
    p.add_argument("--vlmcache-print", dest="print_command", action="store_true",
                   help="print the server command and environment instead of running it")
    p.add_argument("--vlmcache-no-front", dest="no_front", action="store_true",
                   help="engine wiring only, no front (an upstream of `vlmcache proxy`)")
    p.set_defaults(func=cmd_serve)
    p = sub.add_parser("proxy", help="the front as a proxy before vLLM servers")
    p.add_argument("model", help="the local model directory the upstreams serve")
    p.add_argument("--upstream", action="append", required=True,
                   help="an upstream vLLM server URL (repeat for several)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--media-io-kwargs", default=None, metavar="JSON",
                   help="the upstreams' --media-io-kwargs (how they sample video frames)")
    p.add_argument("--routing", default=None, metavar="affinity|round_robin",
                   help="which upstream gets a request: by cache affinity on the "
                   "canonicalized request (falls back to a less loaded or live one) or "
                   "round robin (default: the config's proxy_routing, affinity)")
    p.add_argument("--workers", type=int, default=None, metavar="N",
                   help="front processes on the port, sharing their tiers through the "
                   "config's redis_url (default: the config's proxy_workers, 1)")
    _front_args(p)
    p.set_defaults(func=cmd_proxy)


def _front_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vlmcache-config", help="a vlmcache YAML config file")
    p.add_argument("--vlmcache-set", action="append", metavar="KEY=VALUE",
                   help="one vlmcache config key (overrides the file; repeatable)")


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if raw[:1] == ["serve"]:  # everything vlmcache does not know goes to vLLM
        args, rest = parser.parse_known_args(raw)
        args.vllm_args = rest
    else:
        args = parser.parse_args(raw)
    args.argv = raw[1:]
    try:
        return int(args.func(args))
    except VlmCacheError as exc:
        print(f"vlmcache: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
