"""``vlmcache`` command line: inspect, verify and clear a store; print a config.

    vlmcache stats  --store ~/.cache/vlmcache
    vlmcache verify --store ~/.cache/vlmcache      # reads every chunk, drops corrupt ones
    vlmcache clear  --store ~/.cache/vlmcache --yes
    vlmcache config [--file vlmcache.yaml]         # the effective config, validated
    vlmcache bench  [--dataset easy-vqa] [--modes all] [--out vlmcache-bench]
                                                   # every mode side by side (see bench.run)
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path
from typing import Sequence

from vlmcache.config import VlmCacheConfig
from vlmcache.errors import VlmCacheError

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
    path = _store_path(args)
    disk = _open_disk(path)
    stats = disk.stats()
    exact_entries = sum(1 for f in (path / "exact").glob("*.jsonl")
                        for _ in open(f, encoding="utf-8")) if (path / "exact").is_dir() else 0
    report = {"store": str(path), "kv_chunks": stats.entries,
              "kv_bytes": stats.occupancy_bytes, "exact_log_lines": exact_entries}
    print(json.dumps(report, indent=2) if args.json else
          "\n".join(f"{k:>16}: {v}" for k, v in report.items()))
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
    print(json.dumps(config.to_dict(), indent=2))
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
        if name == "clear":
            p.add_argument("--yes", action="store_true", help="really delete")
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


def main(argv: Sequence[str] | None = None) -> int:
    raw = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(raw)
    args.argv = raw[1:]
    try:
        return int(args.func(args))
    except VlmCacheError as exc:
        print(f"vlmcache: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
