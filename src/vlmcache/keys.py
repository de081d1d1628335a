"""Canonical cache keys.

Every key is bound to a :class:`Namespace` (model identity, weights revision derived from the
weight files' bytes, processor configuration, KV layout, deployment salt) and to the request's
tenant. Prompt KV is keyed per block by a chained hash over block-aligned token ids that folds
in the content hashes of the images whose placeholder tokens fall in the block: two pictures
behind the same placeholder ids never alias, and neither do two tenants.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from vlmcache.errors import ConfigError

logger = logging.getLogger(__name__)

KEY_VERSION = "vlmcache-key-v1"
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
PROCESSOR_FILES = (
    "preprocessor_config.json", "processor_config.json", "tokenizer.json",
    "tokenizer_config.json", "special_tokens_map.json", "chat_template.json",
    "chat_template.jinja", "generation_config.json", "config.json",
)
_HASH_CHUNK = 8 * 1024 * 1024


@dataclass(frozen=True)
class Namespace:
    """What a cached value was computed under; its :attr:`digest` prefixes every key."""

    model_id: str
    weights_revision: str
    processor_digest: str
    kv_layout: str
    tenant_salt: str = field(default="", repr=False)  # a secret: never in a log line

    @property
    def digest(self) -> str:
        payload = json.dumps(
            [KEY_VERSION, self.model_id, self.weights_revision, self.processor_digest,
             self.kv_layout, self.tenant_salt],
            separators=(",", ":"),
        )
        return hashlib.sha256(payload.encode()).hexdigest()

    def describe(self) -> dict[str, str]:
        """The namespace without its salt, for manifests and reports."""
        return {"model_id": self.model_id, "weights_revision": self.weights_revision,
                "processor_digest": self.processor_digest, "kv_layout": self.kv_layout,
                "digest": self.digest}


@dataclass(frozen=True)
class MultiModalSpan:
    """One multimodal item of a prompt: its content identifier and placeholder token range."""

    identifier: str
    offset: int
    length: int


def _utf8(text: str) -> bytes:
    """``text`` as bytes for a key. Tenant names come from clients (JSON allows a lone
    surrogate such as ``"\\ud800"``): ``surrogatepass`` keeps every str distinct, never raises."""
    return text.encode("utf-8", "surrogatepass")


def tenant_scope(namespace_digest: str, tenant: str | None) -> bytes:
    """The root of a request's key chain: namespace plus tenant (``None`` = no tenant)."""
    h = hashlib.sha256(b"scope\0" + namespace_digest.encode())
    h.update(b"\0tenant\0" + _utf8(tenant or "") + (b"\1" if tenant is None else b"\2"))
    return h.digest()


def block_keys(
    scope: bytes,
    token_ids: Sequence[int],
    spans: Sequence[MultiModalSpan],
    block_size: int,
    num_blocks: int | None = None,
) -> list[str]:
    """Chained hex keys of the first ``num_blocks`` full blocks of ``token_ids``.

    Key ``i`` depends on every token of blocks ``0..i`` and on the identifier and position
    of every multimodal item overlapping those blocks, so a key names a prefix exactly.
    """
    if block_size <= 0:
        raise ValueError(f"block_size must be positive, got {block_size}")
    full = len(token_ids) // block_size
    n = full if num_blocks is None else min(num_blocks, full)
    tokens = np.asarray(token_ids[: n * block_size], dtype="<i8")
    keys: list[str] = []
    prev = scope
    for i in range(n):
        start, end = i * block_size, (i + 1) * block_size
        h = hashlib.sha256(prev)
        h.update(tokens[start:end].tobytes())
        for span in spans:
            if span.offset < end and span.offset + span.length > start:
                h.update(f"\0mm\0{span.identifier}\0{span.offset}\0{span.length}".encode())
        prev = h.digest()
        keys.append(h.hexdigest())
    return keys


def image_uuid(deployment_salt: str, tenant: str | None, content_hash: str) -> str:
    """The identity vLLM gets for an image (``multi_modal_uuids``).

    Content-derived and tenant-scoped: vLLM's encoder and processor caches and vlmcache's
    encoder tier key images by it, so one tenant's image never serves another tenant.
    """
    scope = f"{deployment_salt}\0{'' if tenant is None else 't:' + tenant}"
    return "vlmc-" + hashlib.sha256(_utf8(f"{scope}\0{content_hash}")).hexdigest()


def tenant_cache_salt(deployment_salt: str, tenant: str) -> str:
    """The ``cache_salt`` vLLM gets for ``tenant``: isolates vLLM's and our caches."""
    return hashlib.sha256(_utf8(f"{deployment_salt}\0{tenant}")).hexdigest()[:32]


def is_minted_image_uuid(identifier: str) -> bool:
    """Whether ``identifier`` has the shape of an :func:`image_uuid` (``vlmc-`` + 64 hex).

    Only such identities are tenant-scoped; vLLM's own image hashes and client-chosen
    uuids are not, so the encoder-output tier neither stores nor loads under them.
    """
    if not identifier.startswith("vlmc-") or len(identifier) != 69:
        return False
    return all(c in "0123456789abcdef" for c in identifier[5:])


def encoder_output_key(namespace_digest: str, identifier: str) -> str:
    """Store key of one image's encoder output under a namespace."""
    return hashlib.sha256(f"encoder\0{namespace_digest}\0{identifier}".encode()).hexdigest()


def kv_row_key(namespace_digest: str, offload_key: bytes) -> str:
    """Store key of one vLLM KV offload row (``offload_key``: the chunk's last block hash,
    which folds in the request's cache salt and image identities) under a namespace."""
    return hashlib.sha256(namespace_digest.encode() + b"\0kv-row\0" + offload_key).hexdigest()


@dataclass(frozen=True)
class KVRowKeys:
    """A request's KV rows as the KV connector reports them: vLLM's offload keys of its full
    prompt chunks (hex, comma-joined) and the namespace their store keys fold in.

    The store keys (one SHA-256 each: 41 for a 665-token prompt) are derived only where a
    record needs them, in the caller, not on the engine's step loop for every request.
    """

    namespace_digest: str = ""
    offload_keys: str = ""

    @classmethod
    def pack(cls, namespace_digest: str, offload_keys: Sequence[bytes]) -> "KVRowKeys":
        return cls(namespace_digest, ",".join(k.hex() for k in offload_keys))

    def to_params(self) -> dict[str, str]:
        """The connector's ``kv_transfer_params["vlmcache"]`` entries."""
        return {"namespace": self.namespace_digest, "offload_keys": self.offload_keys}

    @classmethod
    def from_params(cls, ours: Mapping[str, object]) -> "KVRowKeys":
        """Read back :meth:`to_params`' entries; a missing or non-string one gives none."""
        namespace, keys = ours.get("namespace"), ours.get("offload_keys")
        if not isinstance(namespace, str) or not isinstance(keys, str):
            return cls()
        return cls(namespace, keys)

    @functools.cached_property
    def store_keys(self) -> tuple[str, ...]:
        """The chunk store keys, in prompt order; none if the connector's value is malformed
        (a record without keys is a miss later, never a wrong row)."""
        if not self.namespace_digest or not self.offload_keys:
            return ()
        try:
            raw = [bytes.fromhex(h) for h in self.offload_keys.split(",")]
        except ValueError:
            logger.warning("vlmcache: malformed offload keys in kv_transfer_params; the "
                           "request's KV is not recorded")
            return ()
        return tuple(kv_row_key(self.namespace_digest, k) for k in raw)


def image_content_hash(image: object) -> str:
    """BLAKE3 of a PIL image's mode, size and pixels (format and metadata do not count).

    It runs in every request's front, over every pixel: for a 672 px RGB image (1.35 MB)
    0.40 ms where SHA-256 took 0.93 ms (2-core CPU, ``benchmarks/HISTORY.md``);
    vLLM hashes images with BLAKE3 too when given no identity."""
    from blake3 import blake3
    from PIL import Image

    if not isinstance(image, Image.Image):
        raise TypeError(f"expected a PIL.Image.Image, got {type(image).__name__}")
    h = blake3(f"{image.mode}\0{image.size[0]}x{image.size[1]}\0".encode())
    h.update(image.tobytes())
    return h.hexdigest()


def video_content_hash(frames: Any, metadata: Mapping[str, Any],
                       processor_kwargs: Mapping[str, Any] | None = None) -> str:
    """BLAKE3 of a video as the engine sees it: its sampled frames' pixels, in order, and
    the metadata its processor gets (fps, frame indices, duration, ...; not the name of the
    decoder that read them), and the request's processor kwargs. A re-muxed copy of the
    same frames has the same hash; a changed, reordered, shifted or trimmed clip has not.
    Domain-separated from :func:`image_content_hash` (``video`` prefix)."""
    from blake3 import blake3

    arr = np.ascontiguousarray(np.asarray(frames))
    meta = {k: v for k, v in metadata.items() if k != "video_backend"}
    head = {"shape": list(arr.shape), "dtype": str(arr.dtype), "meta": meta,
            "kwargs": dict(processor_kwargs or {})}
    h = blake3(b"video\0" + json.dumps(head, sort_keys=True, default=str).encode() + b"\0")
    h.update(memoryview(arr).cast("B"))
    return h.hexdigest()


def processor_digest(model_dir: Path) -> str:
    """Digest of the tokenizer/processor/config files that shape a prompt's tokens."""
    h = hashlib.sha256(b"processor\0")
    for name in PROCESSOR_FILES:
        path = model_dir / name
        if path.is_file():
            h.update(name.encode() + b"\0" + hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


_memo_lock = threading.Lock()


def weights_revision(model_dir: Path, memo_path: Path | None = None) -> str:
    """Digest of the bytes of every weights file under ``model_dir``.

    Hashing multi-GB weights takes seconds, so digests are memoized in ``memo_path`` (JSON)
    keyed by file path, size and mtime: a changed file is hashed again.
    """
    files = sorted(p for p in model_dir.rglob("*") if p.is_file() and p.suffix in WEIGHT_SUFFIXES)
    if not files:
        raise ConfigError(
            f"no weights files ({', '.join(WEIGHT_SUFFIXES)}) under {model_dir}: set "
            "model_revision in the vlmcache config to name the weights explicitly"
        )
    memo = _load_memo(memo_path)
    h = hashlib.sha256(b"weights\0")
    for path in files:
        stat = path.stat()
        memo_key = f"{path.resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
        digest = memo.get(memo_key) or file_sha256(path)
        memo[memo_key] = digest
        h.update(str(path.relative_to(model_dir)).encode() + b"\0" + bytes.fromhex(digest))
    _save_memo(memo_path, memo)
    return h.hexdigest()


def file_sha256(path: Path) -> str:
    """SHA-256 hex digest of a file's bytes, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_HASH_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _load_memo(memo_path: Path | None) -> dict[str, str]:
    from vlmcache.store.chunkfile import _open_read

    if memo_path is None or not memo_path.is_file():
        return {}
    try:  # never through a planted symlink: a forged memo would hide changed weights
        with _open_read(memo_path) as f:
            data = json.loads(f.read())
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}
    except (OSError, ValueError) as exc:
        logger.warning("ignoring unreadable weights digest memo %s: %s", memo_path, exc)
        return {}


def _save_memo(memo_path: Path | None, memo: dict[str, str]) -> None:
    if memo_path is None:
        return
    from vlmcache.store.chunkfile import write_private_file

    with _memo_lock:
        try:  # the store root may be shared: never through a planted symlink
            write_private_file(memo_path, json.dumps(memo, sort_keys=True).encode(),
                               stem="memo", sync=False)  # a lost memo is only re-hashing
        except OSError as exc:
            logger.warning("cannot save weights digest memo %s: %s", memo_path, exc)
