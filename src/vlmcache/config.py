"""vlmcache's one configuration object. Every default lives here.

A :class:`VlmCacheConfig` is frozen and validated once, when it is built. It can be built from
a dict, a YAML file, or vLLM's ``kv_connector_extra_config`` (flat keys, plus an optional
``config_file`` naming a YAML file whose values the other keys override).
"""

from __future__ import annotations

import dataclasses
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, Mapping, get_args, get_type_hints

from vlmcache.errors import ConfigError

GiB = 1024**3
DiskWrite = Literal["async", "sync"]
ImageEmbedderName = Literal["efficientnet-lite0", "phash", "sscd", "clip"]

_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]i?b?|b)?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "b": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
               "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}


def parse_bytes(value: object, key: str) -> int:
    """``4294967296``, ``"4GiB"``, ``"500MB"`` or ``"1.5G"`` -> bytes; errors name ``key``."""
    if isinstance(value, bool):
        raise ConfigError(f"{key}: expected a byte size such as 4GiB or 500MB, got {value!r}")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str) and (m := _SIZE_RE.match(value)):
        unit = (m.group(2) or "").lower().rstrip("b")
        n = int(float(m.group(1)) * _SIZE_UNITS[unit])
    else:
        raise ConfigError(f"{key}: expected a byte size such as 4GiB or 500MB, got {value!r}")
    if n < 0 or (n == 0 and key != "disk_budget"):  # disk_budget 0: memory only
        raise ConfigError(f"{key}: must be a positive byte size, got {value!r}")
    return n


@dataclass(frozen=True)
class VlmCacheConfig:
    """Settings of one vlmcache deployment (all tiers, all stores).

    Attributes:
        store_path: directory of the persistent store (chunks, manifests, tier indexes).
        memory_budget: bytes of CPU memory the in-memory chunk tier may hold.
        disk_budget: bytes the on-disk chunk tier may hold; 0 keeps KV in memory only.
        disk_write: ``"async"`` writes chunks to disk behind the request (default);
            ``"sync"`` finishes the write before the step returns.
        block_size: KV block size in tokens passed to vLLM; ``None`` keeps vLLM's default.
        enable_exact: the exact normalized-prompt tier (L0.5).
        enable_kv_load: load stored KV blocks into vLLM (a lookup that finds nothing is a miss).
        enable_kv_save: capture newly computed full KV blocks into the store.
        enable_encoder_cache: persist vision-encoder outputs and load them instead of
            running the encoder (L1.5).
        encoder_memory_budget: bytes of CPU memory for encoder outputs.
        encoder_disk_budget: bytes of disk for encoder outputs.
        semantic_text_threshold: cosine similarity a paraphrase must reach (L1).
        image_threshold: cosine similarity a near-duplicate image must reach (L2).
        prompt_threshold: cosine similarity a whole prompt must reach (L2 prompt layer).
        enable_image_embedding: the near-duplicate image tier (L2, needs ``[vision]``).
        enable_semantic_text: the paraphrase tiers (L1 and L2 prompt, needs ``[semantic]``).
        enable_gates: refuse paraphrase hits differing in negation/colour/shape/number/side.
        image_embedder: ``efficientnet-lite0``, ``phash``, ``sscd`` or ``clip`` (local weights).
        image_embedder_path: local weights for ``sscd`` (optional) or ``clip`` (required).
        image_embedder_dim: embedding size of a ``clip`` model.
        image_store_budget: bytes of disk for canonical images (a quarter of it, at most
            256 MiB, in memory); evicted images leave the index.
        vector_index_hnsw_threshold: entries past which an index switches from exact
            search to HNSW.
        tenant_salt: a deployment-wide secret folded into every key.
        model_revision: overrides the weights digest (only for weights vlmcache cannot read,
            e.g. ``load_format="dummy"`` benchmarks).
        min_load_tokens: a stored prefix shorter than this is not worth loading.
        exact_max_entries: how many prompts the exact tier remembers (LRU beyond).
        log_requests: log the per-request reuse line at INFO.
    """

    store_path: str = "~/.cache/vlmcache"
    memory_budget: int = 4 * GiB
    disk_budget: int = 50 * GiB
    disk_write: DiskWrite = "async"
    block_size: int | None = None
    enable_exact: bool = True
    enable_kv_load: bool = True
    enable_kv_save: bool = True
    enable_encoder_cache: bool = True
    encoder_memory_budget: int = 1 * GiB
    encoder_disk_budget: int = 20 * GiB
    semantic_text_threshold: float = 0.85
    image_threshold: float = 0.85
    prompt_threshold: float = 0.85
    enable_image_embedding: bool = False
    enable_semantic_text: bool = False
    enable_gates: bool = True
    # pHash by default: on the fidelity benchmark it made 5x fewer false image hits than
    # EfficientNet-Lite0 at the same threshold (a missed near-duplicate is only a miss).
    image_embedder: ImageEmbedderName = "phash"
    image_embedder_path: str | None = None
    image_embedder_dim: int | None = None
    image_store_budget: int = 1 * GiB
    vector_index_hnsw_threshold: int = 20_000
    tenant_salt: str = field(default="", repr=False)
    model_revision: str | None = None
    min_load_tokens: int = 1
    exact_max_entries: int = 100_000
    log_requests: bool = True

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def store_dir(self) -> Path:
        """``store_path`` with ``~`` and environment variables expanded."""
        return Path(os.path.expandvars(os.path.expanduser(self.store_path)))

    @classmethod
    def from_dict(cls, values: Mapping[str, object]) -> "VlmCacheConfig":
        """Build from a mapping; unknown keys and bad values raise :class:`ConfigError`."""
        allowed = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - allowed)
        if unknown:
            raise ConfigError(
                f"unknown config key(s) {unknown}; allowed keys: {sorted(allowed)}"
            )
        return cls(**_coerce_all(dict(values)))

    @classmethod
    def from_yaml(cls, path: str | Path) -> "VlmCacheConfig":
        """Build from a YAML file holding one mapping of config keys."""
        return cls.from_dict(_read_yaml(Path(path)))

    @classmethod
    def from_extra_config(cls, extra: Mapping[str, object] | None) -> "VlmCacheConfig":
        """Build from vLLM's ``kv_connector_extra_config``.

        ``config_file`` (optional) names a YAML file; the other keys override its values.
        Keys vLLM or other connectors put there are ignored only if they start with ``_``.
        """
        values = {k: v for k, v in dict(extra or {}).items() if not k.startswith("_")}
        config_file = values.pop("config_file", None)
        base = _read_yaml(Path(str(config_file))) if config_file else {}
        return cls.from_dict({**base, **values})

    def to_dict(self) -> dict[str, object]:
        """The config as plain values (round-trips through :meth:`from_dict`)."""
        return dataclasses.asdict(self)


def _read_yaml(path: Path) -> dict[str, object]:
    import yaml

    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"config_file {str(path)!r} cannot be read: {exc}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config_file {str(path)!r} is not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config_file {str(path)!r} must hold a mapping of config keys")
    return data


_BYTE_KEYS = ("memory_budget", "disk_budget", "encoder_memory_budget", "encoder_disk_budget",
              "image_store_budget")


def _coerce_all(values: dict[str, object]) -> dict[str, object]:
    for key in _BYTE_KEYS:
        if key in values:
            values[key] = parse_bytes(values[key], key)
    return values


def _validate(cfg: VlmCacheConfig) -> None:
    hints = get_type_hints(VlmCacheConfig)
    for f in dataclasses.fields(cfg):
        _check_type(f.name, getattr(cfg, f.name), hints[f.name])
    for key in _BYTE_KEYS:
        low = 0 if key == "disk_budget" else 1  # disk_budget 0: no disk tier (memory only)
        if getattr(cfg, key) < low:
            raise ConfigError(f"{key}: must be a {'non-negative' if low == 0 else 'positive'} "
                              f"byte size, got {getattr(cfg, key)}")
    if cfg.block_size is not None and (cfg.block_size <= 0 or cfg.block_size % 16):
        raise ConfigError(
            f"block_size: must be a positive multiple of 16 (the CPU backend needs a "
            f"multiple of 32) or null for vLLM's default, got {cfg.block_size}"
        )
    for key in ("semantic_text_threshold", "image_threshold", "prompt_threshold"):
        value = getattr(cfg, key)
        if not 0.0 < value <= 1.0:
            raise ConfigError(f"{key}: must be in (0, 1], got {value}")
    if cfg.vector_index_hnsw_threshold < 1:
        raise ConfigError("vector_index_hnsw_threshold: must be >= 1, got "
                          f"{cfg.vector_index_hnsw_threshold}")
    if cfg.image_embedder == "clip" and (not cfg.image_embedder_path
                                         or not cfg.image_embedder_dim):
        raise ConfigError("image_embedder: 'clip' needs image_embedder_path (local weights) "
                          "and image_embedder_dim")
    if cfg.min_load_tokens < 1:
        raise ConfigError(f"min_load_tokens: must be >= 1, got {cfg.min_load_tokens}")
    if cfg.exact_max_entries < 1:
        raise ConfigError(f"exact_max_entries: must be >= 1, got {cfg.exact_max_entries}")
    if not cfg.store_path.strip():
        raise ConfigError("store_path: must name a directory, got an empty string")


def _check_type(key: str, value: object, hint: object) -> None:
    args = get_args(hint)
    if args and all(isinstance(a, str) for a in args):  # a Literal
        if value not in args:
            raise ConfigError(f"{key}: must be one of {list(args)}, got {value!r}")
        return
    allowed = tuple(a for a in args if isinstance(a, type)) or (hint,)
    if value is None and type(None) in allowed:
        return
    if float in allowed and isinstance(value, int) and not isinstance(value, bool):
        return
    if bool not in allowed and isinstance(value, bool):
        raise ConfigError(f"{key}: expected {_names(allowed)}, got {value!r}")
    if not isinstance(value, allowed):
        raise ConfigError(f"{key}: expected {_names(allowed)}, got {value!r}")


def _names(types: tuple[object, ...]) -> str:
    return " or ".join(getattr(t, "__name__", str(t)).replace("NoneType", "null") for t in types)
