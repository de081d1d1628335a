"""The allowed range of every numeric config key, in one table (issue 33).

:data:`RANGES` names each int or float key of :class:`~vlmcache.config.VlmCacheConfig`; a
test fails when a numeric key is added without a range, so no key can go unchecked. A value
outside its range is a :class:`~vlmcache.errors.ConfigError` naming the key and the range;
a float must also be finite (NaN passes every ``<`` comparison, so it would pass a bound).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from vlmcache.errors import ConfigError


@dataclass(frozen=True)
class Range:
    """Allowed values of one numeric key.

    Attributes:
        low: smallest allowed value (``None``: unbounded).
        high: largest allowed value (``None``: unbounded).
        open_low: ``low`` itself is excluded (``> low``).
        open_high: ``high`` itself is excluded (``< high``).
        is_float: a float key (ints are accepted too; NaN and infinities are not).
        nullable: ``None`` is allowed, with the meaning ``null_means``.
        null_means: what ``None`` selects (said in the error).
        note: what a boundary value means (said in the error), e.g. ``0: memory only``.
    """

    low: float | None
    high: float | None = None
    open_low: bool = False
    open_high: bool = False
    is_float: bool = False
    nullable: bool = False
    null_means: str = ""
    note: str = ""

    def holds(self, value: float) -> bool:
        """Whether ``value`` (not ``None``) is inside the range."""
        if self.low is not None and (value <= self.low if self.open_low else value < self.low):
            return False
        return self.high is None or (value < self.high if self.open_high else value <= self.high)

    def describe(self) -> str:
        """The range in words, e.g. ``in (0, 1]``, ``>= 1`` or ``in [1, 64] or null``."""
        low = _num(self.low) if self.low is not None else None
        high = _num(self.high) if self.high is not None else None
        if low is not None and high is not None:
            text = (f"in {'(' if self.open_low else '['}{low}, {high}"
                    f"{')' if self.open_high else ']'}")
        elif low is not None:
            text = f"{'>' if self.open_low else '>='} {low}"
        else:
            text = f"{'<' if self.open_high else '<='} {high}"
        if self.note:
            text += f" ({self.note})"
        if self.nullable:
            text += f" or null ({self.null_means})" if self.null_means else " or null"
        return text

    def examples_outside(self) -> list[float]:
        """Values just outside the range, of the key's type (for tests)."""
        step = 0.5 if self.is_float else 1
        out: list[float] = []
        if self.low is not None:
            out.append(self.low if self.open_low else self.low - step)
        if self.high is not None:
            out.append(self.high if self.open_high else self.high + step)
        return [v if self.is_float else int(v) for v in out]


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


_BYTES = Range(1, note="a positive byte size")
_COUNT = Range(1)
_SHARE = Range(0, 1, open_low=True, is_float=True)
_POSITIVE_S = Range(0, open_low=True, is_float=True, note="seconds")
_POSITIVE = Range(0, open_low=True, is_float=True)

#: Every numeric key of the config and its allowed values.
RANGES: dict[str, Range] = {
    # byte sizes (strings such as "4GiB" are parsed first)
    "memory_budget": _BYTES,
    "disk_budget": Range(0, note="a byte size; 0: no disk tier, memory only"),
    "encoder_memory_budget": _BYTES,
    "encoder_disk_budget": _BYTES,
    "image_store_budget": _BYTES,
    "response_memory_budget": _BYTES,
    "response_max_entry_bytes": _BYTES,
    "max_image_bytes": _BYTES,
    "max_video_bytes": _BYTES,
    "video_store_budget": _BYTES,
    "video_handoff_budget": Range(0, note="a byte size; 0: vLLM decodes each clip again"),
    "max_request_bytes": _BYTES,
    "redis_kv_budget": _BYTES,
    "redis_encoder_budget": _BYTES,
    "redis_image_budget": _BYTES,
    "redis_response_budget": _BYTES,
    "redis_write_queue_bytes": _BYTES,
    "disk_write_queue": Range(1, note="a positive byte size, at most memory_budget",
                              nullable=True, null_means="min(1 GiB, memory_budget)"),
    # KV blocks and lookups
    "block_size": Range(16, note="a multiple of 16", nullable=True,
                        null_means="vLLM's default"),
    "min_load_tokens": _COUNT,
    "exact_max_entries": _COUNT,
    "kv_io_threads": Range(1, 64),
    "kv_read_bytes_per_s_prior": _POSITIVE,
    "kv_prefill_tokens_per_s_prior": _POSITIVE,
    "encoder_embeds_per_s_prior": _POSITIVE,
    "kv_read_fixed_s": Range(0, is_float=True, note="seconds"),
    # similarity tiers
    "semantic_text_threshold": _SHARE,
    "image_threshold": _SHARE,
    "prompt_threshold": _SHARE,
    "image_verify_threshold": Range(0, 1, open_low=True, is_float=True, nullable=True,
                                    null_means="from calibration"),
    "semantic_facet_threshold": Range(0, 1, open_low=True, is_float=True, nullable=True,
                                      null_means="from calibration"),
    "max_false_hit_rate": Range(0, 1, open_low=True, open_high=True, is_float=True),
    "image_candidates": Range(1, 64),
    "image_candidate_shift": Range(0, 16, note="64ths of the image side; 0: no second search"),
    "image_embedder_dim": Range(1, 65536, nullable=True, null_means="from the embedder"),
    "vector_index_hnsw_threshold": _COUNT,
    # the serving front
    "response_ttl_s": _POSITIVE_S,
    "remote_image_timeout_s": _POSITIVE_S,
    "max_image_pixels": _COUNT,
    "max_images_per_request": _COUNT,
    "proxy_affinity_slack": Range(0, note="0: any extra in-flight request moves it"),
    "proxy_affinity_factor": Range(1, is_float=True, note="1: no share above the least"),
    "proxy_down_s": Range(0, is_float=True, note="seconds; 0: never passed over"),
    "proxy_workers": Range(1, 256, note="front processes of vlmcache proxy"),
    "record_wait_ms": Range(0, 60_000, is_float=True, note="0: never wait for records"),
    "max_video_frames": Range(1, note="a positive count"),
    "max_video_pixels": _COUNT,
    "max_video_duration_s": _POSITIVE_S,
    "video_handoff_ttl_s": _POSITIVE_S,
    "miss_overlap_max_inflight": Range(0, 1_000_000, note="0: never overlap"),
    "held_media_bytes": Range(0, note="bytes; 0: always send media in full"),
    "engine_cpus": Range(0, 1024, note="CPUs left to vLLM; 0: no partition"),
    "front_thread_nice": Range(0, 19, note="a Linux niceness increment"),
    "max_videos_per_request": _COUNT,
    # Redis
    "redis_timeout_ms": _POSITIVE,
    "redis_connect_timeout_ms": _POSITIVE,
    "redis_backoff_max_s": _POSITIVE_S,
    "redis_sync_interval_s": _POSITIVE_S,
    "redis_chunk_ttl_s": Range(1, note="seconds"),
    "redis_log_max_entries": _COUNT,
    # tenant fairness
    "tenant_quota": Range(0, 1, open_low=True, is_float=True,
                          note="a share of each memory tier; 1.0: no quota"),
    "admission_ghost_entries": _COUNT,
}


def check_range(key: str, value: float | None) -> None:
    """Raise :class:`ConfigError` naming ``key`` and its range when ``value`` is outside it
    (``value`` has already passed the key's type check)."""
    rng = RANGES[key]
    if value is None and rng.nullable:
        return
    if value is None or (rng.is_float and not math.isfinite(value)):
        raise ConfigError(f"{key}: must be a finite number {rng.describe()}, got {value!r}")
    if not rng.holds(value):
        raise ConfigError(f"{key}: must be {rng.describe()}, got {value!r}")
