"""The on-disk chunk file format: safetensors with a checksummed header; atomic writes.

Each chunk file holds the tensors plus header metadata ``vlmcache_format``, ``key`` and
``sha256`` (over names, dtypes, shapes and bytes), so a file is verifiable on its own.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import logging
import math
import os
import re
import secrets
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Sequence

import safetensors.torch
import torch

from vlmcache.store.base import Tensors, tensors_nbytes

logger = logging.getLogger(__name__)
FORMAT_VERSION = "1"
MANIFEST_FORMAT = 1
SUFFIX = ".safetensors"
#: Metadata key naming the tenant a chunk's bytes are charged to (its :func:`tenant_label`).
TENANT_META = "tenant"
#: Longer tenant labels are stored as a digest (a header must stay small).
MAX_TENANT_LABEL = 200


def tenant_label(tenant: str | None) -> str | None:
    """How a store names ``tenant`` in files and stats: ASCII-only JSON escapes (any str,
    lone surrogates included), or ``sha256:<hex>`` when that would exceed
    :data:`MAX_TENANT_LABEL` characters."""
    if tenant is None:
        return None
    label = json.dumps(tenant)[1:-1]
    if len(label) <= MAX_TENANT_LABEL:
        return label
    return "sha256:" + hashlib.sha256(tenant.encode("utf-8", "surrogatepass")).hexdigest()
_KEY_RE = re.compile(r"[0-9a-f]{2,128}")
_SHA_RE = re.compile(r"[0-9a-f]{64}")
_TMP_RE = re.compile(r"\.(?P<stem>[0-9a-z]+)\.(?P<pid>\d+)\.[0-9a-f]+\.tmp")
_MAX_HEADER = 100 * 1024 * 1024
_TMP_GRACE_S = 600.0


class _ChunkFault(Exception):
    """A chunk file that exists but cannot be trusted (truncated, corrupt, wrong key...)."""


@dataclass(eq=False)
class _Entry:
    nbytes: int
    sha256: str
    last_used: float
    reused: bool = False  # hit at least once since it was (re)written
    tenant: str | None = None  # whose bytes these are (from the file's metadata)


def check_key(key: object) -> str:
    """Return ``key`` if it is 2..128 lowercase hex characters, else raise ``ValueError``."""
    if not isinstance(key, str):
        raise ValueError(f"chunk key must be a str, got {type(key).__name__}")
    if not 2 <= len(key) <= 128:
        raise ValueError(f"chunk key {key[:140]!r} has length {len(key)}, not 2..128 hex digits")
    if not _KEY_RE.fullmatch(key):
        raise ValueError(f"chunk key {key!r} is not lowercase hex [0-9a-f]")
    return key


def chunk_checksum(tensors: Tensors) -> str:
    """sha256 over the tensors in sorted-name order: each name, dtype and shape, then raw bytes."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name]
        raw = tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
        _digest_tensor(digest, name, str(tensor.dtype).removeprefix("torch."),
                       list(tensor.shape), raw)
    return digest.hexdigest()


def _digest_tensor(digest: Any, name: str, dtype: str, shape: list[int], raw: Any) -> None:
    """One tensor's part of :func:`chunk_checksum` (the one place its format lives)."""
    for part in (json.dumps([name, dtype, shape]).encode(), raw):
        digest.update(len(part).to_bytes(8, "little") if isinstance(part, bytes)
                      else memoryview(part).nbytes.to_bytes(8, "little"))
        digest.update(part)  # hashlib drops the GIL for large buffers: readers run in parallel


def _parse_header(data: bytes) -> dict[str, Any]:
    """The safetensors JSON header of a file's bytes (or of its first bytes)."""
    if len(data) < 8:
        raise _ChunkFault("truncated: no header length")
    size = int.from_bytes(data[:8], "little")
    if size > _MAX_HEADER or size > len(data) - 8:
        raise _ChunkFault(f"truncated or oversized header ({size} B declared)")
    try:
        header = json.loads(data[8 : 8 + size])
    except ValueError as exc:
        raise _ChunkFault(f"unparseable header: {exc}") from exc
    if not isinstance(header, dict):
        raise _ChunkFault("header is not a JSON object")
    return header


def _header_checksum(header: dict[str, Any], key: str) -> str:
    """The sha256 the header's vlmcache metadata declares, after checking format and key."""
    meta = header.get("__metadata__")
    if not isinstance(meta, dict):
        raise _ChunkFault("no vlmcache metadata in header")
    if meta.get("vlmcache_format") != FORMAT_VERSION:
        raise _ChunkFault(f"unknown vlmcache_format {meta.get('vlmcache_format')!r}")
    if meta.get("key") != key:
        raise _ChunkFault(f"header key {meta.get('key')!r} does not match")
    sha = meta.get("sha256")
    if not isinstance(sha, str) or not _SHA_RE.fullmatch(sha):
        raise _ChunkFault("header has no valid sha256")
    return sha


def _payload_bytes(header: dict[str, Any]) -> int:
    """Payload bytes the header declares (what :func:`tensors_nbytes` of the chunk returns)."""
    total = 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        valid = isinstance(offsets, list) and len(offsets) == 2
        if not (valid and all(isinstance(o, int) for o in offsets) and offsets[0] <= offsets[1]):
            raise _ChunkFault(f"bad data_offsets for tensor {name!r}")
        total += offsets[1] - offsets[0]
    return total


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_PRIVATE_FILE = 0o600
_PRIVATE_DIR = 0o700


def _open_read(path: Path, buffering: int = -1) -> BinaryIO:
    """Open a store file for reading without following a planted symlink (ELOOP: OSError)."""
    return open(os.open(path, os.O_RDONLY | _NOFOLLOW | getattr(os, "O_BINARY", 0)), "rb",
                buffering=buffering)


def make_private_dir(path: Path) -> None:
    """Create ``path`` (and parents) as 0700 directories; refuse a symlink or a non-directory.

    Raises ``OSError`` when ``path`` is a symlink (someone may have planted it to redirect
    our writes) or not a directory.
    """
    missing = [p for p in (path, *path.parents) if not os.path.lexists(p)]
    for directory in reversed(missing):  # Path.mkdir(parents=True) would make parents 0777
        with contextlib.suppress(FileExistsError):
            os.mkdir(directory, _PRIVATE_DIR)
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode) or not stat.S_ISDIR(st.st_mode):
        raise OSError(errno.ENOTDIR, "store directory is a symlink or not a directory", str(path))


def _read_chunk(key: str, path: Path
                ) -> tuple[dict[str, torch.Tensor], str, int, str | None]:
    """Read and fully verify one chunk file: (tensors, sha256, payload bytes, tenant)."""
    with _open_read(path) as f:
        data = f.read()
    header = _parse_header(data)
    sha = _header_checksum(header, key)
    tenant = (header.get("__metadata__") or {}).get(TENANT_META)
    try:
        tensors = safetensors.torch.load(data)
    except Exception as exc:  # safetensors raises its own error types for malformed files
        raise _ChunkFault(f"unparseable tensors: {exc}") from exc
    if chunk_checksum(tensors) != sha:
        raise _ChunkFault("checksum mismatch")
    return tensors, sha, tensors_nbytes(tensors), tenant if isinstance(tenant, str) else None


def read_chunk_into(key: str, path: Path, name: str, out: memoryview
                    ) -> tuple[str, int, str | None]:
    """Read a one-tensor uint8 chunk file straight into ``out`` (a writable, contiguous
    byte buffer of the tensor's exact size) and verify it in place: (sha256, payload
    bytes, tenant). The same checks as a full read (header, key, file size, checksum), but
    no intermediate copies: the persistent KV tier reads rows into vLLM's CPU region with
    it. On a :class:`_ChunkFault` ``out`` holds garbage; the caller must not use it."""
    nbytes = out.nbytes
    with _open_read(path, buffering=0) as f:  # the payload goes straight into ``out``
        prefix = f.read(8)
        size = int.from_bytes(prefix, "little") if len(prefix) == 8 else 0
        header = _parse_header(prefix + (f.read(size) if size <= _MAX_HEADER else b""))
        sha = _header_checksum(header, key)
        _check_single_u8(header, name, nbytes)
        if 8 + size + nbytes != os.fstat(f.fileno()).st_size:
            raise _ChunkFault(f"file size does not match its header ({nbytes} B payload)")
        done = 0
        while done < nbytes:
            got = f.readinto(out[done:])
            if not got:
                raise _ChunkFault(f"truncated: {done} of {nbytes} payload bytes")
            done += got
    if u8_checksum(name, out) != sha:
        raise _ChunkFault("checksum mismatch")
    tenant = (header.get("__metadata__") or {}).get(TENANT_META)
    return sha, nbytes, tenant if isinstance(tenant, str) else None


def _check_single_u8(header: dict[str, Any], name: str, nbytes: int) -> None:
    tensors = [k for k in header if k != "__metadata__"]
    info = header.get(name)
    if tensors != [name] or not isinstance(info, dict):
        raise _ChunkFault(f"expected one tensor {name!r}, found {tensors[:4]}")
    if (info.get("dtype") != "U8" or info.get("shape") != [nbytes]
            or info.get("data_offsets") != [0, nbytes]):
        raise _ChunkFault(f"tensor {name!r} is not {nbytes} uint8 bytes")


def u8_checksum(name: str, raw: memoryview) -> str:
    """:func:`chunk_checksum` of ``{name: uint8 tensor over raw}``, without a tensor."""
    digest = hashlib.sha256()
    _digest_tensor(digest, name, "uint8", [raw.nbytes], raw)
    return digest.hexdigest()


def _read_header_file(path: Path) -> dict[str, Any]:
    """Parse only the header of a chunk file (cheap: no payload read)."""
    with _open_read(path) as f:
        prefix = f.read(8)
        size = int.from_bytes(prefix, "little") if len(prefix) == 8 else 0
        body = f.read(size) if size <= _MAX_HEADER else b""
    return _parse_header(prefix + body)


def file_entry(path: Path, key: str) -> tuple[int, str]:
    """(payload bytes, sha256) of a chunk file (see :func:`file_facts`)."""
    nbytes, sha, _ = file_facts(path, key)
    return nbytes, sha


def file_facts(path: Path, key: str) -> tuple[int, str, str | None]:
    """(payload bytes, sha256, tenant) of a chunk file, from the file itself, never from a
    manifest.

    The header's tensor extents must account for the file's size exactly, so a truncated or
    padded file is a :class:`_ChunkFault` (as is a header without valid vlmcache metadata).
    """
    with _open_read(path) as f:
        prefix = f.read(8)
        size = int.from_bytes(prefix, "little") if len(prefix) == 8 else 0
        body = f.read(size) if size <= _MAX_HEADER else b""
        file_size = os.fstat(f.fileno()).st_size
    header = _parse_header(prefix + body)
    sha = _header_checksum(header, key)
    nbytes = _payload_bytes(header)
    end = max((info["data_offsets"][1] for name, info in header.items()
               if name != "__metadata__"), default=0)
    if 8 + size + end != file_size:
        raise _ChunkFault(f"file is {file_size} B, its header describes {8 + size + end} B")
    tenant = (header.get("__metadata__") or {}).get(TENANT_META)
    return nbytes, sha, tenant if isinstance(tenant, str) else None


def _write_bytes(f: BinaryIO, data: bytes | memoryview) -> None:
    """Write ``data`` to ``f`` (a seam for tests simulating a full disk)."""
    f.write(data)


def _write_file(path: Path, data: bytes | Sequence[bytes | memoryview],
                sync: bool = True) -> None:
    """Create ``path`` exclusively (0600, never through a symlink), write ``data`` (or its
    parts, in order), fsync it unless ``sync`` is off."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_BINARY", 0)
    with open(os.open(path, flags, _PRIVATE_FILE), "wb") as f:
        for part in [data] if isinstance(data, bytes) else data:
            _write_bytes(f, part)
        f.flush()
        if sync:
            os.fsync(f.fileno())


def write_private_file(path: Path, data: bytes, *, stem: str, sync: bool = True) -> None:
    """Atomically replace ``path`` with ``data``, for any file vlmcache keeps beside a store.

    The bytes go to a fresh temp file beside ``path`` (unique name, 0600, created with
    ``O_EXCL|O_NOFOLLOW``: a symlink planted there fails the write instead of redirecting
    it), fsynced unless ``sync`` is off, then ``os.replace`` (which replaces a symlink at
    ``path`` itself, never its target). A missing parent is created 0700 (an existing one,
    e.g. a symlinked store root the user chose, is used as it is). ``stem`` ([0-9a-z]+)
    names the temp file, so a dead writer's leftover is recognised. Raises ``OSError``,
    with the temp file removed.
    """
    if not os.path.isdir(path.parent):
        make_private_dir(path.parent)
    tmp = _tmp_path(path.parent, stem)
    try:
        _write_file(tmp, data, sync=sync)
        os.replace(tmp, path)
    except OSError:
        _unlink_quiet(tmp)
        raise


def u8_chunk_header(name: str, nbytes: int, meta: dict[str, str]) -> bytes:
    """The safetensors header (length prefix + JSON, space-padded to 8 bytes) of a chunk
    holding one uint8 tensor ``name`` of ``nbytes``: the payload follows it unchanged."""
    header = {"__metadata__": meta,
              name: {"dtype": "U8", "shape": [nbytes], "data_offsets": [0, nbytes]}}
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    return len(text).to_bytes(8, "little") + text


def _tmp_path(directory: Path, stem: str) -> Path:
    return directory / f".{stem}.{os.getpid()}.{secrets.token_hex(4)}.tmp"


def _fsync_dir(path: Path) -> None:
    """Best-effort fsync of a directory so a rename survives a power loss."""
    with contextlib.suppress(OSError):  # e.g. Windows cannot open directories
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def _unlink_quiet(path: Path) -> bool:
    """Remove ``path``; ``True`` if it was removed. Errors other than absence are logged."""
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    except OSError as exc:
        logger.warning("could not remove %s: %s", path, exc)
        return False


def _pid_gone(pid: int) -> bool:
    """Whether no process ``pid`` runs on this host (``False`` when unsure)."""
    if pid <= 0:
        return True
    if os.name == "nt" or pid == os.getpid():  # os.kill would terminate on Windows
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False
    return False


def _is_stale_tmp(item: os.DirEntry[str]) -> bool:
    """A temp file whose writer (the pid in its name) is gone, or that is older than the grace."""
    match = _TMP_RE.fullmatch(item.name)
    if match is None:
        return False
    if _pid_gone(int(match["pid"])):
        return True
    try:
        return time.time() - item.stat().st_mtime > _TMP_GRACE_S
    except OSError:
        return False


def _scandir(path: Path) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(path) as it:
            return list(it)
    except OSError:
        return []


def scan_keys(root: Path, chunks: Path, store: str) -> set[str]:
    """Keys of the chunk files under ``chunks`` (symlinked shards skipped); stale temp
    files of dead writers in ``root`` and the shards are removed on the way."""
    found: set[str] = set()
    for item in _scandir(root):
        if item.is_file(follow_symlinks=False) and _is_stale_tmp(item):
            _unlink_quiet(Path(item.path))
    for shard in _scandir(chunks):
        if not shard.is_dir(follow_symlinks=False):
            continue
        for item in _scandir(Path(shard.path)):
            key = item.name[: -len(SUFFIX)] if item.name.endswith(SUFFIX) else ""
            if key and _KEY_RE.fullmatch(key) and key[:2] == shard.name:
                found.add(key)
            elif _is_stale_tmp(item):
                logger.info("%s: removing stale temp file %s", store, item.path)
                _unlink_quiet(Path(item.path))
    return found


def _entry_from_json(key: str, item: object) -> _Entry | None:
    """A manifest entry, or ``None`` if it is malformed."""
    if not isinstance(item, dict) or not isinstance(key, str) or not _KEY_RE.fullmatch(key):
        return None
    nbytes, sha, last_used = item.get("bytes"), item.get("sha256"), item.get("last_used")
    if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
        return None
    if not isinstance(sha, str) or not _SHA_RE.fullmatch(sha):
        return None
    if not isinstance(last_used, (int, float)) or isinstance(last_used, bool):
        return None
    if not math.isfinite(last_used):
        return None
    return _Entry(nbytes, sha, float(last_used))
