"""``vlmcache bench`` figure: latency CDFs, reuse per tier, accuracy, threshold sweep.

matplotlib is imported lazily (``pip install 'vlmcache[bench]'``) and drawn with the Agg
canvas directly, leaving pyplot's global backend alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from vlmcache.bench.summary import RunSummary, summarize_run
from vlmcache.bench.types import RequestResult

NO_TIER_REUSE = "tokens reused, no tier"


def _figure(size: tuple[float, float]) -> Any:
    """A matplotlib ``Figure`` on an Agg canvas."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise RuntimeError(
            "bench plots need matplotlib: pip install 'vlmcache[bench]'") from exc
    fig = Figure(figsize=size)
    FigureCanvasAgg(fig)
    return fig


def _latency_cdf(ax: Any, summary: RunSummary) -> None:
    for name, mode in summary.modes.items():
        lat = [v for v in mode.latencies_ms if v > 0]
        if lat:
            ax.step(lat, [(i + 1) / len(lat) for i in range(len(lat))], where="post",
                    label=name)
    ax.set_xscale("log")
    ax.set_xlabel("end-to-end latency per request (ms, log)")
    ax.set_ylabel("share of requests")
    ax.set_title("latency CDF per mode")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=7)


def _reuse_bars(ax: Any, summary: RunSummary) -> None:
    names = list(summary.modes)
    tiers = sorted({t for m in summary.modes.values() for t in m.hit_rates})
    bottom = [0.0] * len(names)
    for tier in tiers:
        values = [summary.modes[n].hit_rates.get(tier, 0.0) for n in names]
        ax.bar(names, values, bottom=bottom, label=tier)
        bottom = [b + v for b, v in zip(bottom, values)]
    rest = [max((summary.modes[n].reuse_rate or 0.0) - b, 0.0) for n, b in zip(names, bottom)]
    ax.bar(names, rest, bottom=bottom, label=NO_TIER_REUSE, color="lightgrey", hatch="//")
    ax.set_ylim(0, 1.2)
    ax.set_ylabel("share of requests")
    ax.set_title("requests that reused work, by deciding tier")
    ax.tick_params(axis="x", labelrotation=30, labelsize=7)
    ax.legend(fontsize=7, loc="upper center", ncol=3)


def _accuracy_bars(ax: Any, summary: RunSummary) -> None:
    names = list(summary.modes)
    x = list(range(len(names)))
    width = 0.4
    for shift, label, attr in ((-width / 2, "accuracy (answer = ground truth)", "accuracy"),
                               (width / 2, "agreement (answer = no_cache's)", "agreement")):
        values = [getattr(summary.modes[n], attr) or 0.0 for n in names]
        ax.bar([i + shift for i in x], values, width, label=label)
    ax.set_xticks(x)
    ax.set_xticklabels(names, rotation=30, fontsize=7)
    ax.set_ylim(0, 1.2)  # room for the legend above the bars
    ax.set_ylabel("share of requests")
    ax.set_title("answers per mode")
    ax.legend(fontsize=7, loc="upper center", ncol=2)


def _sweep(ax: Any, summary: RunSummary) -> None:
    if not summary.sweep:
        ax.text(0.5, 0.5, "no similarity candidates recorded", ha="center", va="center",
                transform=ax.transAxes)
        ax.set_axis_off()
        return
    colours = {"image": "tab:blue", "text": "tab:orange"}
    for key, points in summary.sweep.items():
        t = [p.threshold for p in points]
        colour = colours.get(key)
        n = points[0].n if points else 0
        ax.plot(t, [p.hit_rate or 0.0 for p in points], "-", color=colour,
                label=f"{key}: share that would hit (n={n})")
        ax.plot(t, [p.accuracy or 0.0 for p in points], "--", color=colour,
                label=f"{key}: accuracy, hits answered by their match")
        ax.plot(t, [p.false_hit_rate or 0.0 for p in points], ":", color=colour,
                label=f"{key}: false hits (match's true answer differs)")
    ax.set_xlabel("similarity threshold (best candidate's score >= threshold: a hit)")
    ax.set_ylabel("share of requests with a candidate")
    ax.set_ylim(0, 1.05)
    ax.set_title(f"what-if threshold sweep over {summary.sweep_mode}'s requests", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _unavailable_note(summary: RunSummary) -> str:
    parts = [f"{mode}: {reason[:80]}" for mode, reason in summary.unavailable.items()]
    return "unavailable - " + "; ".join(parts) if parts else ""


def plot_run(summary_or_results: RunSummary | Mapping[str, Sequence[RequestResult]],
             out_png: Path, title: str) -> Path:
    """Write one PNG with four panels: latency CDF per mode, reuse by hit tier, accuracy
    and agreement per mode, and a what-if sweep of the similarity threshold (share that would
    hit, accuracy if each hit answered its match's answer, false hits).

    Takes a ``RunSummary`` or the raw results per mode (summarized here, nothing
    unavailable). Returns ``out_png``.
    """
    summary = (summary_or_results if isinstance(summary_or_results, RunSummary)
               else summarize_run(summary_or_results, {}))
    fig = _figure((13, 9))
    axes = fig.subplots(2, 2)
    _latency_cdf(axes[0][0], summary)
    _reuse_bars(axes[0][1], summary)
    _accuracy_bars(axes[1][0], summary)
    _sweep(axes[1][1], summary)
    note = _unavailable_note(summary)
    if note:
        fig.text(0.01, 0.005, note, fontsize=7, color="dimgrey")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout(rect=(0, 0.02, 1, 0.97))
    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    return out_png
