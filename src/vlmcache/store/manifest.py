"""The disk tier's JSON manifest: an LRU-order hint, never a source of sizes or checksums.

On open, a :class:`~vlmcache.store.disk.DiskStore` takes only each entry's ``last_used`` from
the manifest; bytes and sha256 come from the chunk files themselves, so a manifest edited or
torn by anyone cannot shrink or inflate the occupancy the budget is enforced against.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from vlmcache.store.chunkfile import (
    MANIFEST_FORMAT, _entry_from_json, _Entry, _open_read, write_private_file,
)

logger = logging.getLogger(__name__)


def load_last_used(path: Path, store: str) -> dict[str, float]:
    """``key -> last_used`` of a readable manifest; an unreadable one is ignored (logged)."""
    try:
        with _open_read(path) as f:  # never through a planted symlink
            raw = json.loads(f.read())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        logger.warning("%s: ignoring unreadable manifest: %s", store, exc)
        return {}
    items = raw.get("entries") if isinstance(raw, dict) else None
    if not isinstance(items, dict) or raw.get("format") != MANIFEST_FORMAT:
        logger.warning("%s: ignoring manifest of unknown format", store)
        return {}
    out: dict[str, float] = {}
    for key, item in items.items():
        entry = _entry_from_json(key, item)
        if entry is not None:
            out[key] = entry.last_used
    return out


def write_manifest(path: Path, index: dict[str, _Entry]) -> OSError | None:
    """Atomically replace the manifest with ``index``; the error on I/O faults, else ``None``."""
    entries = {k: {"bytes": e.nbytes, "sha256": e.sha256, "last_used": e.last_used}
               for k, e in index.items()}
    data = json.dumps({"format": MANIFEST_FORMAT, "entries": entries}, separators=(",", ":"))
    try:
        write_private_file(path, data.encode(), stem="manifest")
    except OSError as exc:
        return exc
    return None
