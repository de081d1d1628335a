"""Bench summaries, tables and threshold sweep on synthetic rows."""

from __future__ import annotations

import json

import pytest

from vlmcache.bench.summary import (
    markdown_table,
    per_tier_table,
    percentile,
    summarize_mode,
    summarize_run,
    threshold_sweep,
    to_json,
    workload_table,
)
from vlmcache.bench.types import RequestResult


def row(mode: str, index: int, **kw) -> RequestResult:
    values = {"mode": mode, "index": index, "workload": "zipf", "tenant": None,
              "image_id": f"img{index}", "question": "what shape?", "answer_gt": "circle",
              "output": "circle", "latency_ms": 100.0, "ttft_ms": 50.0,
              "prompt_tokens": 100, "tokens_loaded": 0, "tokens_prefix_cache": 0,
              "tokens_computed": 100, "hit_tier": None}
    return RequestResult(**{**values, **kw})


def test_percentile_interpolates_like_numpy():
    values = [float(v) for v in range(10, 0, -1)]  # 10..1, unsorted
    assert percentile(values, 50) == pytest.approx(5.5)
    assert percentile(values, 90) == pytest.approx(9.1)
    assert percentile([7.0], 90) == 7.0
    assert percentile([], 50) is None


def test_summarize_mode_latency_tokens_reuse_and_tiers():
    rows = [row("m", 0, latency_ms=10.0, ttft_ms=None),
            row("m", 1, latency_ms=20.0, tokens_loaded=60, tokens_computed=40,
                hit_tier="kv"),
            row("m", 2, latency_ms=30.0, tokens_prefix_cache=30, tokens_computed=70),
            row("m", 3, latency_ms=40.0, hit_tier="text:exact", tokens_computed=0,
                ttft_ms=10.0)]
    s = summarize_mode(rows, None)
    assert s.n == 4 and s.mode == "m"
    assert s.latency_p50_ms == pytest.approx(25.0)
    assert s.latency_p90_ms == pytest.approx(37.0)
    assert s.latency_mean_ms == pytest.approx(25.0)
    assert s.ttft_p50_ms == pytest.approx(50.0)  # None left out: median of 50, 50, 10
    assert (s.prompt_tokens, s.tokens_loaded, s.tokens_prefix_cache) == (400, 60, 30)
    assert s.tokens_computed == 210 and s.computed_share == pytest.approx(0.525)
    assert s.reuse_rate == pytest.approx(0.75)  # loaded, prefix-cached, a tier hit
    assert s.hit_rates == {"kv": 0.25, "text:exact": 0.25}
    assert s.agreement is None and s.latency_ratio is None and s.tier_latency_ratio == {}


def test_accuracy_counts_only_rows_with_ground_truth():
    rows = [row("m", 0), row("m", 1, output="square"), row("m", 2, answer_gt=None,
                                                            output="anything")]
    s = summarize_mode(rows, None)
    assert s.accuracy == pytest.approx(0.5) and s.accuracy_n == 2


def test_agreement_joins_baseline_on_index():
    base = [row("no_cache", i, output=o, latency_ms=200.0)
            for i, o in reversed(list(enumerate(["a", "b", "c", "d"])))]
    mode = [row("x", 0, output="a", latency_ms=50.0, hit_tier="kv"),
            row("x", 2, output="WRONG", latency_ms=100.0),
            row("x", 3, output="d", latency_ms=100.0),
            row("x", 9, output="a", latency_ms=100.0)]  # not in the baseline
    s = summarize_mode(mode, base)
    assert s.agreement == pytest.approx(2 / 3) and s.agreement_n == 3
    assert s.latency_ratio == pytest.approx(0.5)
    assert s.tier_latency_ratio == {"kv": pytest.approx(0.25)}


def test_zipf_warm_hit_rate_uses_second_half_of_zipf_indices():
    rows = []
    for i in range(8):  # zipf at even indices 0..14; other workloads in between
        rows.append(row("m", 2 * i, hit_tier="kv" if i >= 4 else None))
        rows.append(row("m", 2 * i + 1, workload="paraphrase", hit_tier="kv"))
    s = summarize_mode(rows, None)
    assert s.zipf_warm_hit_rate == pytest.approx(1.0)
    assert s.workloads["zipf"].reuse_rate == pytest.approx(0.5)
    assert s.workloads["paraphrase"].n == 8
    rows[14] = row("m", 14, hit_tier=None)  # one warm zipf miss
    assert summarize_mode(rows, None).zipf_warm_hit_rate == pytest.approx(0.75)
    assert summarize_mode([row("m", 0, workload="tenants")], None).zipf_warm_hit_rate is None


def _run_results() -> dict[str, list[RequestResult]]:
    base = [row("no_cache", i, latency_ms=100.0 + i, output=f"o{i}", answer_gt=f"o{i}")
            for i in range(4)]
    prefix = [row("prefix_cache", i, latency_ms=50.0 + i, output=f"o{i}", answer_gt=f"o{i}",
                  tokens_prefix_cache=50 if i else 0, tokens_computed=50 if i else 100)
              for i in range(4)]
    full = [row("vlmcache:all", i, latency_ms=20.0, output=f"o{i}" if i < 3 else "x",
                answer_gt=f"o{i}",
                hit_tier="text:exact" if i else None, tokens_loaded=100 if i else 0,
                tokens_computed=0 if i else 100) for i in range(4)]
    return {"no_cache": base, "prefix_cache": prefix, "vlmcache:all": full}


def test_summarize_run_tables_and_json():
    summary = summarize_run(_run_results(),
                            {"native_offload": "not supported on CPU | no connector"})
    assert summary.baseline == "no_cache"
    assert list(summary.modes) == ["no_cache", "prefix_cache", "vlmcache:all"]
    full = summary.modes["vlmcache:all"]
    assert full.agreement == pytest.approx(0.75) and full.reuse_rate == pytest.approx(0.75)
    assert summary.modes["no_cache"].latency_ratio == pytest.approx(1.0)
    table = markdown_table(summary)
    lines = table.splitlines()
    assert lines[0].startswith("| mode | n | p50 ms | x no-cache | TTFT p50 ms")
    assert any(l.startswith("| prefix_cache | 4 | 51.5 | 0.51x |") for l in lines)
    assert "| vlmcache:all | 4 | 20.0 | 0.20x | 50.0 | 25.0% | 75.0% | 75.0% | 75.0% |" \
        in table
    assert "- `native_offload`: not supported on CPU | no connector" in table
    tiers = per_tier_table(summary)
    assert "text:exact" in tiers.splitlines()[0]
    assert "| vlmcache:all | 4 | 75.0% | 25.0% | 75.0% (0.20x) |" in tiers
    assert "| prefix_cache | zipf | 4 | 75.0% |" in workload_table(summary)
    data = json.loads(json.dumps(to_json(summary)))
    assert data["unavailable"] == {"native_offload": "not supported on CPU | no connector"}
    assert "latencies_ms" not in data["modes"]["no_cache"]
    assert data["modes"]["vlmcache:all"]["workloads"]["zipf"]["n"] == 4
    assert data["sweep"] == {} and data["sweep_mode"] is None


def test_summarize_run_without_baseline():
    results = _run_results()
    del results["no_cache"]
    summary = summarize_run(results, {})
    assert summary.baseline is None
    assert all(m.agreement is None and m.latency_ratio is None
               for m in summary.modes.values())
    assert "Unavailable" not in markdown_table(summary)


def _sweep_rows() -> list[RequestResult]:
    scores = [0.72, 0.80, 0.85, 0.90, 0.95, 0.99]
    rows = [row("vlmcache:all", i, answer_gt="red", output="red",
                candidates={"image": s, "text": 1.0 - s / 2},
                candidate_answers={k: "red" if i % 2 == 0 else "blue" for k in ("image", "text")},
                candidate_gts={k: "red" if i % 2 == 0 else "blue" for k in ("image", "text")})
            for i, s in enumerate(scores)]
    return rows + [row("vlmcache:all", 99)]  # no candidates: ignored


def test_threshold_sweep_hit_rate_and_accuracy():
    rows = _sweep_rows()
    base = {r.index: "red" for r in rows}
    curves = threshold_sweep(rows, base, [0.70, 0.85, 0.96, 1.0])
    assert set(curves) == {"image", "text"}
    image = curves["image"]
    assert [p.n for p in image] == [6] * 4
    assert [p.hit_rate for p in image] == pytest.approx([1.0, 4 / 6, 1 / 6, 0.0])
    # hits answer the candidate's answer: odd indices say "blue" (wrong)
    assert [p.accuracy for p in image] == pytest.approx([0.5, 4 / 6, 5 / 6, 1.0])
    assert image[0].false_hit_rate == pytest.approx(0.5)
    full = threshold_sweep(rows, base)
    for curve in full.values():
        hits = [p.hit_rate for p in curve]
        assert hits == sorted(hits, reverse=True)
    assert threshold_sweep([row("m", 0), row("m", 1)], base) == {}


def test_threshold_sweep_falls_back_to_row_output():
    rows = [row("m", 0, answer_gt="red", output="red", candidates={"text": 0.5},
                candidate_answers={"text": "blue"})]
    assert threshold_sweep(rows, {}, [0.9])["text"][0].accuracy == 1.0
    assert threshold_sweep(rows, {0: "green"}, [0.9])["text"][0].accuracy == 0.0


def test_summarize_run_sweeps_preferred_mode():
    results = _run_results()
    results["vlmcache:all"] = _sweep_rows()
    results["vlmcache:text"] = _sweep_rows() + _sweep_rows()
    summary = summarize_run(results, {})
    assert summary.sweep_mode == "vlmcache:all"
    assert summary.sweep["image"][0].threshold == pytest.approx(0.70)
    assert to_json(summary)["sweep"]["image"][0]["hit_rate"] == 1.0


def test_markdown_table_leaves_out_a_column_no_mode_measured():
    timed = summarize_run({"no_cache": [row("no_cache", i) for i in range(3)]}, {})
    assert "TTFT p50 ms" in markdown_table(timed)
    untimed = summarize_run({"no_cache": [row("no_cache", i, ttft_ms=None) for i in range(3)]},
                            {})
    table = markdown_table(untimed)
    assert "TTFT" not in table and "| accuracy |" in table
    assert all(line.count("|") == table.splitlines()[0].count("|")
               for line in table.splitlines()[:3])
