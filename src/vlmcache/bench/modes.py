"""The modes ``vlmcache bench`` compares: vLLM alone, vLLM's own offloading, vlmcache tiers.

Every mode replays the same requests with the same engine settings; only what a mode names
here differs. vLLM's prefix cache (L0) stays on under every vlmcache mode, as in serving.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from vlmcache.errors import ConfigError

#: vlmcache config switches a mode may turn on; all others are off in that mode.
TIER_SWITCHES = ("enable_exact", "enable_kv_load", "enable_kv_save", "enable_encoder_cache",
                 "enable_image_embedding", "enable_semantic_text",
                 "enable_video_near_duplicates")


@dataclass(frozen=True)
class Mode:
    """One way of serving the benchmark's requests."""

    name: str
    description: str
    prefix_caching: bool = True
    native_offload: bool = False
    tiers: tuple[str, ...] = ()  # the TIER_SWITCHES this mode turns on (none: no vlmcache)

    @property
    def vlmcache(self) -> bool:
        return bool(self.tiers)

    def config_overrides(self) -> dict[str, bool]:
        """``VlmCacheConfig`` switches for this mode (every tier named, on or off)."""
        return {switch: switch in self.tiers for switch in TIER_SWITCHES}

    def engine_overrides(self, offload_gib: float) -> dict[str, Any]:
        """``vllm.LLM`` arguments this mode sets on top of the shared engine settings."""
        args: dict[str, Any] = {"enable_prefix_caching": self.prefix_caching}
        if self.native_offload:
            args["kv_offloading_size"] = offload_gib
        return args


_KV = ("enable_exact", "enable_kv_load", "enable_kv_save")

MODES: dict[str, Mode] = {m.name: m for m in (
    Mode("no_cache", "vLLM, prefix caching off: every request computed", prefix_caching=False),
    Mode("prefix_cache", "vLLM's own GPU/CPU-resident prefix cache only"),
    Mode("native_offload", "vLLM's own CPU KV offloading (kv_offloading_size), no vlmcache",
         native_offload=True),
    Mode("vlmcache:kv", "exact tier (L0.5) + the KV path: vLLM's offloading connector "
         "(CPU tier) + vlmcache's persistent tier and cost model", tiers=_KV),
    Mode("vlmcache:encoder", "encoder-output tier (L1.5) alone",
         tiers=("enable_encoder_cache",)),
    Mode("vlmcache:image", "near-duplicate image tier (L2) alone: canonical image, then "
         "vLLM's prefix cache", tiers=("enable_image_embedding",)),
    Mode("vlmcache:text", "paraphrase tiers (L1, L2 prompt) alone: canonical question, then "
         "vLLM's prefix cache", tiers=("enable_semantic_text",)),
    Mode("vlmcache:all", "every vlmcache tier", tiers=TIER_SWITCHES),
)}

BASELINE = "no_cache"


def gpu_available() -> bool:
    """Whether this install runs vLLM on a CUDA GPU (vLLM's CPU offloading needs one)."""
    try:
        import torch

        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def default_modes(gpu: bool | None = None) -> tuple[str, ...]:
    """Every mode this install can run: ``native_offload`` only with a GPU (vLLM's CPU KV
    offloading refuses other platforms)."""
    on_gpu = gpu_available() if gpu is None else gpu
    return tuple(m.name for m in MODES.values() if on_gpu or not m.native_offload)


def parse_modes(text: str, gpu: bool | None = None) -> tuple[str, ...]:
    """Mode names from a comma list (``all``: every mode this install runs); errors name the
    allowed ones."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if names == ["all"]:
        return default_modes(gpu)
    unknown = [n for n in names if n not in MODES]
    if unknown or not names:
        raise ConfigError(f"unknown mode(s) {unknown or text!r}; allowed: "
                          f"{', '.join(MODES)} (or 'all')")
    return tuple(dict.fromkeys(names))
