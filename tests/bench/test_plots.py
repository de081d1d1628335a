"""The bench figure is written from summaries or raw results."""

from __future__ import annotations

import sys

import pytest

from vlmcache.bench.plots import plot_run
from vlmcache.bench.summary import summarize_run
from vlmcache.bench.types import RequestResult

pytest.importorskip("matplotlib")

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _results(with_candidates: bool) -> dict[str, list[RequestResult]]:
    out = {}
    for k, mode in enumerate(("no_cache", "prefix_cache", "vlmcache:all")):
        out[mode] = [RequestResult(
            mode=mode, index=i, workload="zipf" if i % 2 else "paraphrase", tenant=None,
            image_id=f"img{i % 3}", question="q", answer_gt="red",
            output="red" if i % 4 else "blue", latency_ms=100.0 / (k + 1) + i,
            ttft_ms=10.0, prompt_tokens=100, tokens_loaded=80 * (k == 2 and i > 2),
            tokens_prefix_cache=50 * (k == 1 and i > 0), tokens_computed=50,
            hit_tier="text:exact" if k == 2 and i > 4 else None,
            candidates={"image": 0.7 + i / 40, "text": 0.9} if with_candidates else {},
            candidate_answers={"image": "red", "text": "red"}) for i in range(12)]
    return out


def test_plot_run_writes_png_from_summary(tmp_path):
    summary = summarize_run(_results(True), {"native_offload": "not on this platform"})
    assert summary.sweep
    out = plot_run(summary, tmp_path / "figs" / "bench.png", "bench test")
    assert out == tmp_path / "figs" / "bench.png"
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 10_000


def test_plot_run_from_results_without_candidates(tmp_path):
    out = plot_run(_results(False), tmp_path / "bench.png", "no sweep")
    assert out.read_bytes().startswith(PNG_MAGIC) and out.stat().st_size > 10_000


def test_missing_matplotlib_names_the_extra(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)
    monkeypatch.setitem(sys.modules, "matplotlib.backends.backend_agg", None)
    with pytest.raises(RuntimeError, match=r"pip install 'vlmcache\[bench\]'"):
        plot_run(_results(False), tmp_path / "x.png", "x")
    assert not (tmp_path / "x.png").exists()
