"""Exact tier (L0.5): normalized prompt text + image content hashes -> the canonical prompt.

A request whose prompt differs from a cached one only in case, spacing or Unicode form is
rewritten to the cached prompt's exact text, so everything below (vLLM's prefix cache, the
persistent KV store) hits exactly. Records also name the KV chunks the prompt was stored under.

Persistence is an append-only JSON-lines log beside the store, compacted when it grows to
twice the live entries: a crash loses at most a torn last line, which loading skips.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import threading
import time
import unicodedata
from collections import OrderedDict
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

logger = logging.getLogger(__name__)

_SPACE_RE = re.compile(r"\s+")


@dataclass(frozen=True)
class ExactRecord:
    """One cached prompt: its exact text and where its KV blocks are stored."""

    key: str
    canonical_prompt: str
    image_hashes: tuple[str, ...]
    chunk_keys: tuple[str, ...]
    prompt_tokens: int
    created: float


def normalize_prompt(text: str) -> str:
    """Unicode NFKC, case-folded, whitespace runs collapsed, ends stripped."""
    return _SPACE_RE.sub(" ", unicodedata.normalize("NFKC", text).casefold()).strip()


class ExactTextTier:
    """Lookup-only exact tier with an explicit :meth:`record` for the capture path.

    Args:
        path: the JSON-lines file this tier persists to (created if missing).
        namespace_digest: binds every entry to model, weights, processor and salt.
        max_entries: entries kept; the least recently recorded go first.
    """

    def __init__(self, path: Path, namespace_digest: str, max_entries: int) -> None:
        self.path = path
        self.namespace_digest = namespace_digest
        self.max_entries = max_entries
        self._entries: OrderedDict[str, ExactRecord] = OrderedDict()
        self._log_lines = 0
        self._lock = threading.Lock()
        self._load()

    def key(self, prompt: str, image_hashes: Sequence[str], tenant: str | None) -> str:
        payload = json.dumps([self.namespace_digest, tenant, normalize_prompt(prompt),
                              list(image_hashes)], separators=(",", ":"))
        return hashlib.sha256(payload.encode()).hexdigest()

    def lookup(self, prompt: str, image_hashes: Sequence[str],
               tenant: str | None) -> ExactRecord | None:
        """The record for this prompt and images, if any. No side effects."""
        with self._lock:
            return self._entries.get(self.key(prompt, image_hashes, tenant))

    def record(self, prompt: str, image_hashes: Sequence[str], tenant: str | None,
               chunk_keys: Sequence[str], prompt_tokens: int) -> ExactRecord:
        """Remember ``prompt`` as the canonical text of its normalized form (persisted)."""
        key = self.key(prompt, image_hashes, tenant)
        with self._lock:
            existing = self._entries.get(key)
            prompt_text = existing.canonical_prompt if existing else prompt
            rec = ExactRecord(key, prompt_text, tuple(image_hashes), tuple(chunk_keys),
                              prompt_tokens, existing.created if existing else time.time())
            self._entries[key] = rec
            self._entries.move_to_end(key)
            while len(self._entries) > self.max_entries:
                self._entries.popitem(last=False)
            self._append(rec)
        return rec

    def __len__(self) -> int:
        return len(self._entries)

    def _append(self, rec: ExactRecord) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with open(self.path, "a", encoding="utf-8") as f:
                f.write(json.dumps(asdict(rec), separators=(",", ":")) + "\n")
            self._log_lines += 1
            if self._log_lines > 2 * max(len(self._entries), 64):
                self._compact()
        except OSError as exc:
            logger.warning("exact tier: cannot persist to %s (%s); kept in memory only",
                           self.path, exc)

    def _compact(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        with open(tmp, "w", encoding="utf-8") as f:
            for rec in self._entries.values():
                f.write(json.dumps(asdict(rec), separators=(",", ":")) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self._log_lines = len(self._entries)

    def _load(self) -> None:
        if not self.path.is_file():
            return
        bad = 0
        with open(self.path, encoding="utf-8", errors="replace") as f:
            for line in f:
                self._log_lines += 1
                rec = _parse_record(line)
                if rec is None:
                    bad += 1
                    continue
                self._entries[rec.key] = rec
                self._entries.move_to_end(rec.key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)
        if bad:
            logger.warning("exact tier: skipped %d unreadable line(s) in %s", bad, self.path)


def _parse_record(line: str) -> ExactRecord | None:
    try:
        d = json.loads(line)
        return ExactRecord(key=str(d["key"]), canonical_prompt=str(d["canonical_prompt"]),
                           image_hashes=tuple(map(str, d["image_hashes"])),
                           chunk_keys=tuple(map(str, d["chunk_keys"])),
                           prompt_tokens=int(d["prompt_tokens"]), created=float(d["created"]))
    except (ValueError, KeyError, TypeError):
        return None
