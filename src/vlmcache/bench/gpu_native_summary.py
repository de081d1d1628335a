"""The figures issue 11's targets are judged on, from the GPU benchmark's per-mode
measurements (:mod:`vlmcache.bench.gpu_native_path`): pure functions, no GPU."""

from __future__ import annotations

import statistics
from typing import Any

#: the plain-vLLM modes: ``vllm_repeat`` runs last, so the baseline is measured at both ends
#: of a run (the drift between engine processes on one machine is part of the noise)
BASELINES = ("vllm", "vllm_repeat")


def _get(modes: dict[str, Any], mode: str, phase: str, key: str = "median_ms") -> Any:
    value = modes.get(mode, {}).get(phase)
    return value.get(key) if isinstance(value, dict) else None


def _baseline(modes: dict[str, Any], phase: str) -> float | None:
    """Plain vLLM's median for ``phase`` over every request of both baseline runs."""
    samples = [ms for m in BASELINES for ms in (_get(modes, m, phase, "all_ms") or [])]
    if not samples:
        return _get(modes, "vllm", phase)
    return round(statistics.median(samples), 2)


def _baseline_tput(modes: dict[str, Any]) -> float | None:
    runs = [t for m in BASELINES if (t := _get(modes, m, "miss_batch", "prompt_tok_s"))]
    return statistics.mean(runs) if runs else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return round(a / b, 3) if a is not None and b else None


def shape_summary(modes: dict[str, Any], block_size: int) -> dict[str, Any]:
    """The figures the issue's targets are judged on (None where a mode failed)."""
    prompt = _get(modes, "vlmcache_restart", "restart_hit", "prompt_tokens")
    choices = _get(modes, "vlmcache_restart", "restart_hit", "cost_model_choices") or []
    reason = _get(modes, "vlmcache_restart", "restart_hit", "cost_model_reason")
    if not choices:  # nothing stored to decide on: the capture's choice not to write it
        choices = _get(modes, "vlmcache", "miss", "cost_model_choices") or []
        reason = _get(modes, "vlmcache", "miss", "cost_model_reason")
    s: dict[str, Any] = {
        "recompute_ms": _baseline(modes, "miss"),
        "recompute_runs_ms": [_get(modes, m, "miss") for m in BASELINES if m in modes],
        "vllm_gpu_hit_ms": _baseline(modes, "gpu_hit"),
        "vllm_gpu_hit_runs_ms": [_get(modes, m, "gpu_hit") for m in BASELINES if m in modes],
        "native_cpu_hit_ms": _get(modes, "native_cpu", "cpu_hit"),
        "native_tiering_miss_ms": _get(modes, "native_tiering", "miss"),
        "native_tiering_cpu_hit_ms": _get(modes, "native_tiering", "cpu_hit"),
        "native_fs_restart_ms": _get(modes, "native_tiering_restart", "restart_hit"),
        "native_fs_restart_tokens_cached": _get(modes, "native_tiering_restart",
                                                "restart_hit", "tokens_cached"),
        "miss_ms": _get(modes, "vlmcache", "miss"),
        "miss_batch_tput_ratio": _ratio(_get(modes, "vlmcache", "miss_batch", "prompt_tok_s"),
                                        _baseline_tput(modes)),
        # admission_memory: second_sight: the first miss captures nothing, the second does
        "miss_again_ms": _get(modes, "vlmcache", "miss_again"),
        "miss_again_batch_tput_ratio": _ratio(
            _get(modes, "vlmcache", "miss_again_batch", "prompt_tok_s"), _baseline_tput(modes)),
        "gpu_hit_ms": _get(modes, "vlmcache", "gpu_hit"),
        "cpu_hit_ms": _get(modes, "vlmcache", "cpu_hit"),
        "restart_ms": _get(modes, "vlmcache_restart", "restart_hit"),
        "restart_tokens_loaded": _get(modes, "vlmcache_restart", "restart_hit",
                                      "tokens_loaded"),
        # what the persistent store held for the request when it was answered (its leading
        # chunk files), and the block-aligned prefix a full load is (vLLM always computes
        # the last prompt token)
        "restart_tokens_stored": _get(modes, "vlmcache_restart", "restart_hit",
                                      "tokens_stored"),
        "restart_tokens_loadable": (int(prompt) - 1) // block_size * block_size
        if prompt else None,
        "cost_model_choice": choices[0] if len(choices) == 1 else (choices or None),
        "cost_model_reason": reason,
    }
    s["targets"] = _targets(s)
    variants = sorted({m.partition("@")[2] for m in modes if "@" in m})
    if variants:  # vlmcache modes run with another admission (``vlmcache@second_sight``)
        s["variants"] = {v: shape_summary(_as_default(modes, v), block_size) for v in variants}
    return s


def _as_default(modes: dict[str, Any], variant: str) -> dict[str, Any]:
    """The peers' modes plus ``variant``'s vlmcache modes under the default's names."""
    peers = {m: r for m, r in modes.items() if "@" not in m and not m.startswith("vlmcache")}
    ours = {m.partition("@")[0]: r for m, r in modes.items() if m.endswith(f"@{variant}")}
    return {**peers, **ours}


def _targets(s: dict[str, Any]) -> dict[str, bool | None]:
    def le(a: str, b: str, k: float = 1.05) -> bool | None:
        return None if s[a] is None or s[b] is None else s[a] <= k * s[b]

    stored = s["restart_tokens_stored"]
    full = (None if s["restart_tokens_loaded"] is None or stored is None else
            s["restart_tokens_loaded"] >= min(stored, s["restart_tokens_loadable"] or 0) > 0)
    return {"miss_le_1.05x_recompute": le("miss_ms", "recompute_ms"),
            "miss_batch_tput_ge_95pct": None if s["miss_batch_tput_ratio"] is None
            else s["miss_batch_tput_ratio"] >= 0.95,
            "gpu_hit_le_1.05x_vllm_gpu_hit": le("gpu_hit_ms", "vllm_gpu_hit_ms"),
            "cpu_hit_le_1.05x_native_cpu_hit": le("cpu_hit_ms", "native_cpu_hit_ms"),
            "restart_le_1.05x_recompute": le("restart_ms", "recompute_ms"),
            # judged whenever the cost model chose a load for any request of the row
            "restart_full_load_when_loaded": full if "load" in _as_list(s["cost_model_choice"])
            else None}


def _as_list(choice: str | list[str] | None) -> list[str]:
    return [choice] if isinstance(choice, str) else list(choice or [])
