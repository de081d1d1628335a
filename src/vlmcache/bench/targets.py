"""The issue's performance targets, checked against GPU measurements and a bench run.

Targets:

(a) a vlmcache CPU-tier hit (after the GPU prefix cache dropped the blocks) is faster
    than a vLLM native-offload hit, and at most 1.5x a GPU hit for the LLaVA shape,
    1.15x for the Qwen2-VL shape;
(b) a hit from any tier is never slower than recomputing;
(c) capture on, all misses: batch prefill throughput >= 95% of no-cache, batch-1
    latency <= 1.05x no-cache;
(d) lookup cascade p50 <= 5 ms with 100k entries;
(e) zipfian hit rate >= 80% once warm.

(a)-(d) come from the ``gpu`` mapping (see ``GpuMeasurements.from_mapping``), (b) also
from the bench run's per-tier latency ratios and (e) from the bench run. A value that is
missing reads NOT MEASURED.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from vlmcache.bench.summary import RunSummary, md_table

MET, NOT_MET, NOT_MEASURED = "MET", "NOT MET", "NOT MEASURED"
#: Shapes the issue names, with the CPU-hit / GPU-hit limit (matched as a substring).
SHAPE_LIMITS = {"llava": 1.5, "qwen2-vl": 1.15}
LOOKUP_P50_MS, LOOKUP_ENTRIES = 5.0, 100_000
THROUGHPUT_MIN, CAPTURE_LATENCY_MAX, ZIPF_WARM_MIN = 0.95, 1.05, 0.80
#: Modes whose zipf warm hit rate answers (e), the first one present wins.
ZIPF_MODES = ("vlmcache:all", "vlmcache:exact")


@dataclass(frozen=True)
class GpuShape:
    """One model shape's GPU timings (ms, batch 1 unless noted); ``None``: not measured."""

    recompute_ms: float | None = None  # no cache, capture off (a plain miss)
    gpu_hit_ms: float | None = None  # vLLM prefix-cache hit (blocks still on the GPU)
    native_offload_hit_ms: float | None = None  # vLLM's CPU offloading connector hit
    vlmcache_cpu_hit_ms: float | None = None  # vlmcache CPU tier, GPU cache dropped
    vlmcache_disk_hit_ms: float | None = None  # vlmcache disk tier, CPU tier dropped
    capture_miss_ms: float | None = None  # vlmcache capture on, a miss
    nocache_batch_tok_s: float | None = None  # batch prefill tokens/s, no cache
    capture_batch_tok_s: float | None = None  # the same with vlmcache capture on, all misses
    cpu_hit_limit: float | None = None  # overrides SHAPE_LIMITS for this shape


@dataclass(frozen=True)
class GpuMeasurements:
    """What the GPU runs measured, per shape, plus the lookup cascade's latency."""

    shapes: dict[str, GpuShape]
    lookup_p50_ms: float | None = None
    lookup_entries: int | None = None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> GpuMeasurements:
        """Parse ``{"shapes": {name: {key: value}}, "lookup_p50_ms": float,
        "lookup_entries": int}``; shape keys are ``GpuShape``'s fields. Shape names
        containing "llava" / "qwen2-vl" get the issue's limits. Unknown keys raise
        ``ValueError`` (a typo would otherwise read NOT MEASURED)."""
        extra = set(data) - {"shapes", "lookup_p50_ms", "lookup_entries"}
        known = {f.name for f in fields(GpuShape)}
        for name, values in (data.get("shapes") or {}).items():
            extra |= {f"shapes.{name}.{k}" for k in set(values) - known}
        if extra:
            raise ValueError(f"unknown GPU measurement keys: {sorted(extra)}")
        shapes = {name: GpuShape(**values) for name, values in (data.get("shapes") or {}).items()}
        return cls(shapes=shapes, lookup_p50_ms=data.get("lookup_p50_ms"),
                   lookup_entries=data.get("lookup_entries"))


@dataclass(frozen=True)
class TargetRow:
    """One checked target (for one shape or source)."""

    target: str
    scope: str
    measured: str
    status: str


def _check(ok: bool) -> str:
    return MET if ok else NOT_MET


def _limit(name: str, shape: GpuShape) -> float | None:
    if shape.cpu_hit_limit is not None:
        return shape.cpu_hit_limit
    return next((v for k, v in SHAPE_LIMITS.items() if k in name.lower()), None)


def _shapes_with_expected(gpu: GpuMeasurements | None) -> dict[str, GpuShape]:
    shapes = dict(gpu.shapes) if gpu else {}
    for expected in SHAPE_LIMITS:
        if not any(expected in name.lower() for name in shapes):
            shapes[expected] = GpuShape()
    return shapes


def _target_a(name: str, s: GpuShape) -> list[TargetRow]:
    what = "(a) CPU-tier hit faster than native offload hit"
    if s.vlmcache_cpu_hit_ms is None or s.native_offload_hit_ms is None:
        rows = [TargetRow(what, name, "-", NOT_MEASURED)]
    else:
        rows = [TargetRow(what, name, f"{s.vlmcache_cpu_hit_ms:.2f} vs "
                          f"{s.native_offload_hit_ms:.2f} ms",
                          _check(s.vlmcache_cpu_hit_ms < s.native_offload_hit_ms))]
    limit = _limit(name, s)
    what = f"(a) CPU-tier hit <= {limit:g}x GPU hit" if limit else "(a) CPU-tier hit vs GPU hit"
    if limit is None or s.vlmcache_cpu_hit_ms is None or not s.gpu_hit_ms:
        return rows + [TargetRow(what, name, "-", NOT_MEASURED)]
    ratio = s.vlmcache_cpu_hit_ms / s.gpu_hit_ms
    return rows + [TargetRow(what, name, f"{ratio:.2f}x", _check(ratio <= limit))]


def _target_b_gpu(name: str, s: GpuShape) -> TargetRow:
    what = "(b) no tier slower than recompute"
    tiers = {"gpu": s.gpu_hit_ms, "cpu": s.vlmcache_cpu_hit_ms, "disk": s.vlmcache_disk_hit_ms}
    ratios = {k: v / s.recompute_ms for k, v in tiers.items()
              if v is not None and s.recompute_ms}
    if not ratios:
        return TargetRow(what, name, "-", NOT_MEASURED)
    measured = ", ".join(f"{k} {v:.2f}x" for k, v in ratios.items())
    return TargetRow(what, name, measured, _check(max(ratios.values()) <= 1.0))


def _target_b_run(cpu: RunSummary | None) -> TargetRow:
    what, scope = "(b) no tier slower than recompute", "bench run (p50 per tier)"
    ratios = {f"{mode} {tier}": r for mode, m in (cpu.modes.items() if cpu else ())
              if mode.startswith("vlmcache") for tier, r in m.tier_latency_ratio.items()}
    if not ratios:
        return TargetRow(what, scope, "-", NOT_MEASURED)
    worst = max(ratios, key=ratios.get)
    return TargetRow(what, scope, f"worst {worst} {ratios[worst]:.2f}x",
                     _check(ratios[worst] <= 1.0))


def _target_c(name: str, s: GpuShape) -> list[TargetRow]:
    what = f"(c) capture-on batch throughput >= {THROUGHPUT_MIN:.0%} of no-cache"
    if s.capture_batch_tok_s is None or not s.nocache_batch_tok_s:
        rows = [TargetRow(what, name, "-", NOT_MEASURED)]
    else:
        share = s.capture_batch_tok_s / s.nocache_batch_tok_s
        rows = [TargetRow(what, name, f"{share:.1%}", _check(share >= THROUGHPUT_MIN))]
    what = f"(c) capture-on batch-1 miss <= {CAPTURE_LATENCY_MAX:g}x no-cache"
    if s.capture_miss_ms is None or not s.recompute_ms:
        return rows + [TargetRow(what, name, "-", NOT_MEASURED)]
    ratio = s.capture_miss_ms / s.recompute_ms
    return rows + [TargetRow(what, name, f"{ratio:.3f}x", _check(ratio <= CAPTURE_LATENCY_MAX))]


def _target_d(gpu: GpuMeasurements | None) -> TargetRow:
    what = f"(d) lookup cascade p50 <= {LOOKUP_P50_MS:g} ms"
    entries = (gpu.lookup_entries if gpu else None) or LOOKUP_ENTRIES
    scope = f"{entries:,} entries"
    if gpu is None or gpu.lookup_p50_ms is None:
        return TargetRow(what, scope, "-", NOT_MEASURED)
    measured = f"{gpu.lookup_p50_ms:.3f} ms"
    if entries < LOOKUP_ENTRIES:
        return TargetRow(what, scope, measured + f" (target is at {LOOKUP_ENTRIES:,})",
                         NOT_MEASURED)
    return TargetRow(what, scope, measured, _check(gpu.lookup_p50_ms <= LOOKUP_P50_MS))


def _target_e(cpu: RunSummary | None) -> TargetRow:
    what = f"(e) zipf hit rate >= {ZIPF_WARM_MIN:.0%} once warm"
    modes = cpu.modes if cpu else {}
    for mode in ZIPF_MODES:
        rate = modes[mode].zipf_warm_hit_rate if mode in modes else None
        if rate is not None:
            return TargetRow(what, f"bench run {mode}", f"{rate:.1%}",
                             _check(rate >= ZIPF_WARM_MIN))
    return TargetRow(what, "bench run", "-", NOT_MEASURED)


def check_targets(gpu: Mapping[str, Any] | GpuMeasurements | None,
                  cpu: RunSummary | None) -> list[TargetRow]:
    """Every target row: per GPU shape for (a)-(c), the bench run for (b) and (e)."""
    if gpu is not None and not isinstance(gpu, GpuMeasurements):
        gpu = GpuMeasurements.from_mapping(gpu)
    shapes = _shapes_with_expected(gpu)
    rows = [row for name, s in shapes.items() for row in _target_a(name, s)]
    rows += [_target_b_gpu(name, s) for name, s in shapes.items()] + [_target_b_run(cpu)]
    rows += [row for name, s in shapes.items() for row in _target_c(name, s)]
    return rows + [_target_d(gpu), _target_e(cpu)]


def targets_table(gpu: Mapping[str, Any] | GpuMeasurements | None,
                  cpu: RunSummary | None) -> str:
    """The targets as a markdown table: target, scope, measured value, status.

    ``gpu``: ``{"shapes": {"llava": {...}, "qwen2-vl": {...}}, "lookup_p50_ms": 1.2,
    "lookup_entries": 100000}`` with per-shape keys ``recompute_ms``, ``gpu_hit_ms``,
    ``native_offload_hit_ms``, ``vlmcache_cpu_hit_ms``, ``vlmcache_disk_hit_ms``,
    ``capture_miss_ms``, ``nocache_batch_tok_s``, ``capture_batch_tok_s`` and optional
    ``cpu_hit_limit`` (see ``GpuShape``); any may be left out. ``cpu``: a bench run.
    """
    rows = check_targets(gpu, cpu)
    return "\n".join(md_table(("target", "scope", "measured", "status"),
                         [(r.target, r.scope, r.measured, r.status) for r in rows]))
