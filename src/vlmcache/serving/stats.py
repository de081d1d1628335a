"""What ``vlmcache stats`` prints: a store's contents, and a running server's metrics.

The store is read from its files (never trusting a manifest's sizes): chunk counts and
bytes of the KV, encoder-output and canonical-image stores, exact-tier records, index
files. A memory-only deployment (``disk_budget: 0``) has nothing on disk: its numbers are
on the server's ``/metrics`` (``--server``), which this reads and sums per metric.
"""

from __future__ import annotations

from pathlib import Path

_SUBSTORES = (("kv", "kv"), ("encoder", "encoder"), ("images", "image"))
#: Opening a store to inspect it must never evict: a budget nothing reaches.
_INSPECT_BUDGET = 1 << 62


def store_stats(path: Path) -> dict[str, object]:
    """Chunks and bytes of the KV, encoder-output and canonical-image stores at ``path``,
    exact-tier records and index files; :class:`VlmCacheError` if there is no store."""
    from vlmcache.errors import VlmCacheError
    from vlmcache.store.disk import DiskStore

    if not any((path / sub).is_dir() for sub, _ in _SUBSTORES):
        raise VlmCacheError(f"no vlmcache store at {path} (no kv/, encoder/ or images/)")
    report: dict[str, object] = {"store": str(path)}
    for sub, name in _SUBSTORES:
        chunks = nbytes = 0
        if (path / sub).is_dir():
            disk = DiskStore(path / sub, _INSPECT_BUDGET)
            stats = disk.stats()
            chunks, nbytes = stats.entries, stats.occupancy_bytes
            disk.close()
        report[f"{name}_chunks"], report[f"{name}_bytes"] = chunks, nbytes
    exact = sorted((path / "exact").glob("*.jsonl")) if (path / "exact").is_dir() else []
    report["exact_log_lines"] = sum(_lines(f) for f in exact)
    index = [f for d in ("image_index", "semantic") if (path / d).is_dir()
             for f in (path / d).rglob("*") if f.is_file()]
    report["index_files"], report["index_bytes"] = len(index), sum(_size(f) for f in index)
    return report


def server_metrics(url: str, timeout_s: float = 5.0) -> dict[str, float]:
    """``vlmcache_*`` samples of a server's ``/metrics``, summed over labels per name."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url.rstrip("/") + "/metrics", timeout=timeout_s).text
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("vlmcache_") and not sample.name.endswith(
                    ("_created", "_bucket")):
                sums[sample.name] = sums.get(sample.name, 0.0) + float(sample.value)
    return dict(sorted(sums.items()))


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(1 for _ in f)
    except OSError:
        return 0
