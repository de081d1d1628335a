"""``vlmcache bench`` results per mode: summaries, a threshold sweep, JSON and tables.

One ``ModeSummary`` per mode (one engine each), compared with the ``no_cache`` baseline
joined on the request ``index``; ``RunSummary`` holds them, the modes that could not run
(with the reason) and the similarity threshold sweep.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from vlmcache.bench.types import RequestResult

BASELINE = "no_cache"
THRESHOLDS = tuple(round(0.70 + 0.01 * i, 2) for i in range(30))  # 0.70 .. 0.99
SWEEP_KEYS = ("image", "text")
#: The mode whose rows feed the sweep when several recorded candidates.
SWEEP_PREFERRED = "vlmcache:all"


@dataclass
class WorkloadSummary:
    """One workload's rows within a mode."""

    n: int
    reuse_rate: float | None
    accuracy: float | None
    agreement: float | None
    latency_p50_ms: float | None
    tokens_loaded: int = 0  # from vlmcache's store
    tokens_prefix_cache: int = 0  # vLLM's own prefix cache
    tokens_computed: int = 0


@dataclass
class ModeSummary:
    """One mode's rows, compared with the baseline (``no_cache``) where one is given.

    Rates are fractions in [0, 1]; ``None`` where there is nothing to measure (no rows,
    no ground truth, no baseline). ``hit_rates``: ``hit_tier`` value -> share of all
    rows; ``tier_latency_ratio``: tier -> p50 over its hits of latency / the baseline's
    latency for the same request. ``latencies_ms`` (sorted) feeds the CDF plot and is
    left out of ``to_json``.
    """

    mode: str
    n: int
    latency_p50_ms: float | None
    latency_p90_ms: float | None
    latency_mean_ms: float | None
    ttft_p50_ms: float | None
    prompt_tokens: int
    tokens_loaded: int
    tokens_prefix_cache: int
    tokens_computed: int
    computed_share: float | None
    reuse_rate: float | None
    hit_rates: dict[str, float]
    accuracy: float | None
    accuracy_n: int
    agreement: float | None
    agreement_n: int
    latency_ratio: float | None
    tier_latency_ratio: dict[str, float]
    zipf_warm_hit_rate: float | None
    workloads: dict[str, WorkloadSummary]
    latencies_ms: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class SweepPoint:
    """Hit rate and accuracy of one similarity tier at one threshold."""

    threshold: float
    n: int
    hit_rate: float | None
    accuracy: float | None
    false_hit_rate: float | None  # would hit, and the candidate's true answer differs


@dataclass
class RunSummary:
    """All modes of a run (in the given order), unavailable ones, and the sweep."""

    modes: dict[str, ModeSummary]
    unavailable: dict[str, str]
    baseline: str | None
    sweep: dict[str, list[SweepPoint]] = field(default_factory=dict)
    sweep_mode: str | None = None


def percentile(values: Iterable[float], q: float) -> float | None:
    """The ``q``-th percentile (0-100), linearly interpolated (numpy's default)."""
    data = sorted(values)
    if not data:
        return None
    pos = (len(data) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


def _rate(flags: Sequence[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


def reused(row: RequestResult) -> bool:
    """A cache served part of the request: tokens loaded or prefix-cached, or a tier hit."""
    return row.tokens_loaded > 0 or row.tokens_prefix_cache > 0 or row.hit_tier is not None


def _accuracy(rows: Sequence[RequestResult]) -> tuple[float | None, int]:
    judged = [row.correct for row in rows if row.correct is not None]
    return _rate(judged), len(judged)


def _agreement(rows: Sequence[RequestResult],
               base: Mapping[int, RequestResult] | None) -> tuple[float | None, int]:
    if base is None:
        return None, 0
    same = [row.output == base[row.index].output for row in rows if row.index in base]
    return _rate(same), len(same)


def zipf_warm_hit_rate(rows: Sequence[RequestResult]) -> float | None:
    """Reuse rate over the zipf rows in the second half of the zipf indices (warm cache)."""
    indices = sorted({row.index for row in rows if row.workload == "zipf"})
    warm = set(indices[len(indices) // 2:])
    return _rate([reused(row) for row in rows if row.workload == "zipf" and row.index in warm])


def _tier_latency_ratio(rows: Sequence[RequestResult],
                        base: Mapping[int, RequestResult] | None) -> dict[str, float]:
    if base is None:
        return {}
    ratios: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        ref = base.get(row.index)
        if row.hit_tier is not None and ref is not None and ref.latency_ms > 0:
            ratios[row.hit_tier].append(row.latency_ms / ref.latency_ms)
    return {tier: statistics.median(v) for tier, v in sorted(ratios.items())}


def _workloads(rows: Sequence[RequestResult],
               base: Mapping[int, RequestResult] | None) -> dict[str, WorkloadSummary]:
    groups: dict[str, list[RequestResult]] = defaultdict(list)
    for row in rows:
        groups[row.workload].append(row)
    return {name: WorkloadSummary(
        n=len(group), reuse_rate=_rate([reused(r) for r in group]),
        accuracy=_accuracy(group)[0], agreement=_agreement(group, base)[0],
        latency_p50_ms=percentile([r.latency_ms for r in group], 50),
        tokens_loaded=sum(r.tokens_loaded for r in group),
        tokens_prefix_cache=sum(r.tokens_prefix_cache for r in group),
        tokens_computed=sum(r.tokens_computed for r in group))
        for name, group in sorted(groups.items())}


def summarize_mode(rows: Sequence[RequestResult],
                   baseline: Sequence[RequestResult] | None) -> ModeSummary:
    """One mode's latency, token, reuse, accuracy and agreement figures.

    ``baseline``: the ``no_cache`` rows (agreement and latency ratios are joined on
    ``index``), or ``None`` when there is no baseline run.
    """
    base = None if baseline is None else {row.index: row for row in baseline}
    latencies = sorted(row.latency_ms for row in rows)
    prompt = sum(row.prompt_tokens for row in rows)
    computed = sum(row.tokens_computed for row in rows)
    tiers = Counter(row.hit_tier for row in rows if row.hit_tier is not None)
    p50 = percentile(latencies, 50)
    base_p50 = None if base is None else percentile([r.latency_ms for r in base.values()], 50)
    accuracy, accuracy_n = _accuracy(rows)
    agreement, agreement_n = _agreement(rows, base)
    return ModeSummary(
        mode=rows[0].mode if rows else "", n=len(rows),
        latency_p50_ms=p50, latency_p90_ms=percentile(latencies, 90),
        latency_mean_ms=statistics.fmean(latencies) if latencies else None,
        ttft_p50_ms=percentile([r.ttft_ms for r in rows if r.ttft_ms is not None], 50),
        prompt_tokens=prompt, tokens_loaded=sum(r.tokens_loaded for r in rows),
        tokens_prefix_cache=sum(r.tokens_prefix_cache for r in rows),
        tokens_computed=computed, computed_share=computed / prompt if prompt else None,
        reuse_rate=_rate([reused(r) for r in rows]),
        hit_rates={tier: count / len(rows) for tier, count in sorted(tiers.items())},
        accuracy=accuracy, accuracy_n=accuracy_n, agreement=agreement,
        agreement_n=agreement_n,
        latency_ratio=p50 / base_p50 if p50 is not None and base_p50 else None,
        tier_latency_ratio=_tier_latency_ratio(rows, base),
        zipf_warm_hit_rate=zipf_warm_hit_rate(rows), workloads=_workloads(rows, base),
        latencies_ms=latencies)


def threshold_sweep(rows: Sequence[RequestResult], baseline_output: Mapping[int, str],
                    thresholds: Sequence[float] = THRESHOLDS) -> dict[str, list[SweepPoint]]:
    """Hit rate and accuracy against the threshold, per similarity tier ("image", "text").

    At threshold ``t`` a row would hit if ``candidates[key] >= t``; it would then answer
    ``candidate_answers[key]`` (the answer of the cached request the candidate points to),
    else its cache-off answer (``baseline_output[index]``, falling back to the row's own
    output). Rows without a scored, answered candidate for that key are left out; a key no
    row has is absent, so rows without any candidates give ``{}``.
    """
    curves: dict[str, list[SweepPoint]] = {}
    for key in SWEEP_KEYS:
        scored = [row for row in rows if key in row.candidates and key in row.candidate_answers]
        if scored:
            curves[key] = [_sweep_point(scored, key, t, baseline_output) for t in thresholds]
    return curves


def _sweep_point(rows: Sequence[RequestResult], key: str, t: float,
                 baseline_output: Mapping[int, str]) -> SweepPoint:
    hits = [row.candidates[key] >= t for row in rows]
    answers = [row.candidate_answers[key] if hit else baseline_output.get(row.index, row.output)
               for row, hit in zip(rows, hits)]
    judged = [(row, hit, ans) for row, hit, ans in zip(rows, hits, answers)
              if row.answer_gt is not None]
    return SweepPoint(
        threshold=t, n=len(rows), hit_rate=_rate(hits),
        accuracy=_rate([ans == row.answer_gt for row, _, ans in judged]),
        false_hit_rate=_rate([hit and row.candidate_gts.get(key) != row.answer_gt
                              for row, hit, _ in judged]))


def _sweep_source(results: Mapping[str, Sequence[RequestResult]]) -> str | None:
    counts = {mode: sum(bool(r.candidates) for r in rows) for mode, rows in results.items()}
    counts = {mode: c for mode, c in counts.items() if c}
    if not counts:
        return None
    return SWEEP_PREFERRED if SWEEP_PREFERRED in counts else max(counts, key=counts.get)


def summarize_run(results: Mapping[str, Sequence[RequestResult]],
                  unavailable: Mapping[str, str],
                  thresholds: Sequence[float] = THRESHOLDS) -> RunSummary:
    """Every mode's summary against ``no_cache`` (if it ran), plus the threshold sweep.

    The sweep uses the rows of ``vlmcache:all`` if they recorded candidates, else of the
    mode with the most rows that did; cache-off answers come from ``no_cache``.
    """
    baseline = BASELINE if BASELINE in results else None
    base_rows = results[baseline] if baseline else None
    modes = {}
    for mode, rows in results.items():
        modes[mode] = summarize_mode(rows, base_rows)
        modes[mode].mode = mode
    source = _sweep_source(results)
    sweep = {}
    if source is not None:
        base_out = {row.index: row.output for row in base_rows or ()}
        sweep = threshold_sweep(results[source], base_out, thresholds)
    return RunSummary(modes=modes, unavailable=dict(unavailable), baseline=baseline,
                      sweep=sweep, sweep_mode=source)


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    return value


def to_json(summary: RunSummary | ModeSummary) -> dict[str, Any]:
    """A plain JSON-able dict (floats rounded to 4 places, raw latencies left out)."""
    data = asdict(summary)
    for mode in data["modes"].values() if "modes" in data else (data,):
        mode.pop("latencies_ms", None)
    return _rounded(data)


# ---------------------------------------------------------------------------- tables


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.1f}%"


def _num(value: float | None, fmt: str = ".1f", suffix: str = "") -> str:
    return "-" if value is None else f"{value:{fmt}}{suffix}"


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    """A markdown table's lines ("|" in cells escaped)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell.replace("|", "\\|") for cell in row) + " |"
              for row in rows]
    return lines


def _unavailable_lines(summary: RunSummary) -> list[str]:
    if not summary.unavailable:
        return []
    return ["", "Unavailable modes:"] + [f"- `{mode}`: {reason}"
                                         for mode, reason in summary.unavailable.items()]


def markdown_table(summary: RunSummary) -> str:
    """One row per mode (p50, x no-cache, TTFT, tokens computed, reuse, accuracy,
    agreement with no-cache), then the unavailable modes with their reasons."""
    header = ["mode", "n", "p50 ms", "x no-cache", "TTFT p50 ms", "tokens computed",
              "reuse", "accuracy", "agreement"]
    rows = [[name, str(m.n), _num(m.latency_p50_ms), _num(m.latency_ratio, ".2f", "x"),
             _num(m.ttft_p50_ms), _pct(m.computed_share), _pct(m.reuse_rate),
             _pct(m.accuracy), _pct(m.agreement)] for name, m in summary.modes.items()]
    # a column no mode measured (vLLM's timings off, no ground truth) is left out
    keep = [i for i in range(len(header))
            if i < 4 or any(r[i] != _num(None) for r in rows)]
    header = [header[i] for i in keep]
    rows = [[r[i] for i in keep] for r in rows]
    return "\n".join(md_table(header, rows) + _unavailable_lines(summary))


def per_tier_table(summary: RunSummary) -> str:
    """Per mode: the share of requests each tier decided (with its p50 latency ratio to
    no-cache in brackets), reuse and miss shares."""
    tiers = sorted({t for m in summary.modes.values() for t in m.hit_rates})
    header = ("mode", "n", "reuse", "no tier", *tiers)
    rows = []
    for name, m in summary.modes.items():
        cells = []
        for tier in tiers:
            ratio = m.tier_latency_ratio.get(tier)
            extra = "" if ratio is None else f" ({ratio:.2f}x)"
            cells.append(_pct(m.hit_rates.get(tier, 0.0)) + extra)
        no_tier = 1.0 - sum(m.hit_rates.values()) if m.n else None
        rows.append((name, str(m.n), _pct(m.reuse_rate), _pct(no_tier), *cells))
    return "\n".join(md_table(header, rows))


def workload_table(summary: RunSummary) -> str:
    """Per mode and workload: n, reuse, accuracy, agreement, p50 latency."""
    header = ("mode", "workload", "n", "reuse", "accuracy", "agreement", "p50 ms")
    rows = [(name, wl, str(w.n), _pct(w.reuse_rate), _pct(w.accuracy), _pct(w.agreement),
             _num(w.latency_p50_ms))
            for name, m in summary.modes.items() for wl, w in m.workloads.items()]
    return "\n".join(md_table(header, rows))


def token_table(summary: RunSummary, order: Sequence[str] = ()) -> str:
    """Per mode and workload (those in ``order`` first, in that order): where the prompt
    tokens came from (vlmcache's store, vLLM's prefix cache, computed), the share of
    answers equal to ``no_cache``'s and the p50 latency."""
    header = ("mode", "workload", "n", "tokens loaded", "from prefix cache", "computed",
              "equal to no_cache", "p50 ms")
    rank = {name: i for i, name in enumerate(order)}

    def first_in_order(item: tuple[str, WorkloadSummary]) -> int:
        return rank.get(item[0], len(rank))

    rows = [(name, wl, str(w.n), str(w.tokens_loaded), str(w.tokens_prefix_cache),
             str(w.tokens_computed), _pct(w.agreement), _num(w.latency_p50_ms))
            for name, m in summary.modes.items()
            for wl, w in sorted(m.workloads.items(), key=first_in_order)]
    return "\n".join(md_table(header, rows))
