"""Exact tier (L0.5): normalized prompt text + image content hashes -> the canonical prompt.

A request whose prompt differs from a cached one only in spacing, Unicode form or the case of
its first word is rewritten to the cached prompt's exact text, so everything below (vLLM's
prefix cache, the persistent KV store) hits exactly. Records also name the KV chunks the prompt was stored under.

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

from vlmcache.store.chunkfile import make_private_dir, write_private_file

logger = logging.getLogger(__name__)

_SPACE_RE = re.compile(r"\s+")
#: Part of every key: records written under an older, looser normalization (version 1
#: folded case after ':' and '?', merging ": Turkey?" with ": turkey?") are never hit again.
NORMALIZATION_VERSION = 2


@dataclass(frozen=True)
class ExactRecord:
    """One cached prompt: its exact text and where its KV blocks are stored."""

    key: str
    canonical_prompt: str
    image_hashes: tuple[str, ...]
    chunk_keys: tuple[str, ...]
    prompt_tokens: int
    created: float


# Spans folded by nothing (not even spacing): code blocks, inline code, quotations. A
# single quote opens a quotation only at a word boundary (not the one in "what's").
_VERBATIM_RE = re.compile(r"```.*?```|`[^`]*`|\"[^\"]*\"|\u201c[^\u201d]*\u201d"
                          r"|\u2018[^\u2019]*\u2019|(?<![\w'])'[^'\n]*'(?![\w'])", re.DOTALL)
# The first word of the prompt or of a line: where a user's question starts (after a chat
# template's "USER: <image>\n", or serving.openai_req.encode_transcript's message and part
# markers, each ending a line). Nothing after ':', '?' or '.' on a line is folded: a capital
# there may be a name (": Turkey?").
_LINE_START_RE = re.compile(r"(^|\n)(\s*)([A-Z][a-z]*)(?!\w)")
# First words folded there: question words, auxiliaries, articles, prepositions and common
# instructions, none of which is also a name, a nationality or a label (so not "May", "Will",
# "Turkey", "Polish", "A"); a word in any other case ("WHAT", "iPhone") is never folded.
_FOLDABLE = frozenset("""
    an the this that these those there here it its what which who whom whose where when
    why how is are was were am be been do does did can could should would shall must has
    have had in on at of for from to with by if please describe count list name give tell
    answer identify explain find show read look select choose write compare first hello hi
    hey thanks thank summarize translate classify provide create make check determine
    consider suppose imagine using based given according and but or so then now ok okay yes
""".split())


def normalize_prompt(text: str) -> str:
    """Fold only what cannot change meaning: spacing and the case of a first word.

    Unicode is put in canonical form (NFC: the same characters, encoded alike); NFKC is
    not applied because it merges characters that differ in meaning (``x²``/``x2``,
    ``H₂O``/``H2O``, ``½``, ``①``, ``℃``). Outside quotations and code, whitespace runs
    collapse to one space, and the first word of the prompt or of a line (where a question
    starts after a chat template's ``USER: <image>\\n``, or a chat message or part) loses its
    capital when it is a common function word in sentence case (``What`` -> ``what``, see
    ``_FOLDABLE``). No other case is folded: nothing after ``:``, ``?`` or ``.`` on a line
    (``: Turkey?``/``: turkey?``), no name even at a line start (``Polish``/``polish``),
    not ``US`` vs ``us``, ``aB3x`` vs ``Ab3X``, ``Straße`` vs ``strasse``. Quoted and code
    spans are kept verbatim.
    """
    text = unicodedata.normalize("NFC", text).strip()
    parts, last = [], 0
    for m in _VERBATIM_RE.finditer(text):
        parts.append(_fold_plain(text[last:m.start()], at_start=last == 0))
        parts.append(m.group(0))
        last = m.end()
    parts.append(_fold_plain(text[last:], at_start=last == 0))
    return "".join(parts).strip()


def _fold_plain(segment: str, at_start: bool) -> str:
    """Collapse spacing; lower-case a foldable first word of the text or of a line."""
    def fold(m: re.Match[str]) -> str:
        word = m.group(3)
        return m.group(1) + m.group(2) + (word.lower() if word.lower() in _FOLDABLE else word)

    folded = _LINE_START_RE.sub(fold, segment if at_start else "\0" + segment)
    folded = folded if at_start else folded[1:]
    return _SPACE_RE.sub(" ", folded)


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
        payload = json.dumps([self.namespace_digest, NORMALIZATION_VERSION, tenant,
                              normalize_prompt(prompt), list(image_hashes)],
                             separators=(",", ":"))
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
        line = (json.dumps(asdict(rec), separators=(",", ":")) + "\n").encode()
        try:
            make_private_dir(self.path.parent)
            _append_line(self.path, line)
            self._log_lines += 1
            if self._log_lines > 2 * max(len(self._entries), 64):
                self._compact()
        except OSError as exc:
            logger.warning("exact tier: cannot persist to %s (%s); kept in memory only",
                           self.path, exc)

    def _compact(self) -> None:
        data = "".join(json.dumps(asdict(rec), separators=(",", ":")) + "\n"
                       for rec in self._entries.values())
        write_private_file(self.path, data.encode(), stem="exact")  # O_EXCL|O_NOFOLLOW, 0600
        self._log_lines = len(self._entries)

    def _load(self) -> None:
        if not self.path.is_file():
            return
        bad = 0
        try:  # never through a planted symlink
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError as exc:
            logger.warning("exact tier: cannot read %s (%s); starting empty", self.path, exc)
            return
        with open(fd, encoding="utf-8", errors="replace") as f:
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


def _append_line(path: Path, line: bytes) -> None:
    """Append ``line`` to the 0600 log, first ending a torn last line (a failed earlier write).

    The fragment then stays a line of its own that loading skips, instead of swallowing the
    record appended after it. A write that fails part-way raises; the next append repairs it.
    """
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
    fd = os.open(path, flags, 0o600)
    try:
        size = os.fstat(fd).st_size
        if size and os.pread(fd, 1, size - 1) != b"\n":
            logger.warning("exact tier: %s ends in a torn line; closing it before appending",
                           path)
            line = b"\n" + line
        view = memoryview(line)
        while view:  # os.write may write less than asked on a nearly full disk
            view = view[os.write(fd, view):]
    finally:
        os.close(fd)


def _parse_record(line: str) -> ExactRecord | None:
    try:
        d = json.loads(line)
        return ExactRecord(key=str(d["key"]), canonical_prompt=str(d["canonical_prompt"]),
                           image_hashes=tuple(map(str, d["image_hashes"])),
                           chunk_keys=tuple(map(str, d["chunk_keys"])),
                           prompt_tokens=int(d["prompt_tokens"]), created=float(d["created"]))
    except (ValueError, KeyError, TypeError):
        return None
