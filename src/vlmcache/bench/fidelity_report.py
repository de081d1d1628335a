"""Fidelity results as a text table and a PNG plot (threshold sweep)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def gate_cost(curves: dict[str, list[dict[str, Any]]], threshold: float) -> dict[str, Any]:
    """The text tier at ``threshold`` with and without the paraphrase gate."""
    def at(name: str) -> dict[str, Any]:
        return min(curves[name], key=lambda p: abs(p["threshold"] - threshold))

    return {"threshold": threshold, "with_gate": at("semantic_text"),
            "without_gate": at("semantic_text:no_gate")}


def table(summary: dict[str, dict[str, Any]]) -> str:
    """The per-tier/category table as text."""
    cols = ("n", "hit_rate", "false_hit_rate", "accuracy", "accuracy_no_cache",
            "agreement_with_no_cache", "latency_ms_median", "latency_ms_median_no_cache")
    lines = [f"{'':24}" + "".join(f"{c[:14]:>15}" for c in cols)]
    for name, m in summary.items():
        cells = "".join(f"{'-' if m.get(c) is None else m[c]:>15}" for c in cols)
        lines.append(f"{name[:24]:24}{cells}")
    return "\n".join(lines)


def plot(curves: dict[str, list[dict[str, Any]]], path: Path, title: str) -> None:
    """Hit rate and accuracy against the threshold, one panel per tier."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    panels = (("embedding:vision", ("embedding:vision",)),
              ("semantic_text", ("semantic_text", "semantic_text:no_gate")))
    for ax, (name, keys) in zip(axes, panels):
        for key in keys:
            style = "--" if key.endswith("no_gate") else "-"
            t = [p["threshold"] for p in curves[key]]
            for metric, colour in (("hit_rate", "tab:blue"), ("accuracy", "tab:green"),
                                   ("false_hit_rate", "tab:red")):
                label = f"{metric}{' (no gate)' if style == '--' else ''}"
                ax.plot(t, [p[metric] or 0 for p in curves[key]], style, color=colour,
                        label=label)
        ax.set_title(name)
        ax.set_xlabel("threshold")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
