"""The GPU serving benchmark's pieces that need no server: trace, Poisson schedule, summary."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from vlmcache_lab.serve_gpu_load import Slo, miss_ids, summarize, verdict
from vlmcache_lab.serve_gpu_trace import (DEFAULT_MIX, KINDS, ImageSpec, build_trace,
                                          composition, image_data_url, parse_mix,
                                          poisson_offsets)


def test_trace_is_reproducible_from_its_seed() -> None:
    a, b, c = build_trace(400, seed=7), build_trace(400, seed=7), build_trace(400, seed=8)
    assert a == b
    assert a != c
    assert image_data_url(a[5].image, 7) == image_data_url(b[5].image, 7)


def test_default_mix_has_every_kind_and_at_most_a_quarter_exact_repeats() -> None:
    trace = build_trace(3000, seed=0)
    comp = composition(trace)
    assert set(comp["kinds"]) == set(KINDS)
    assert comp["exact_repeat_share"] <= 0.25
    assert comp["exact_repeats"] >= comp["kinds"]["repeat"]  # drawn repeats are all repeats
    assert comp["tenants"]["tenant-b"] == comp["kinds"]["flood"]
    assert all(8 <= r.max_tokens <= 32 for r in trace)
    # the flooding tenant never sends an image twice
    flood = [r.image.base for r in trace if r.kind == "flood"]
    assert len(flood) == len(set(flood))


def test_a_long_trace_keeps_the_bound_and_a_shorter_one_is_unchanged() -> None:
    import json

    long = composition(build_trace(9000, seed=0))  # 26.2% before variants were redrawn
    assert long["exact_repeat_share"] <= 0.25
    assert long["kinds"]["repeat"] > 0.13 * 9000  # the drawn repeats stay
    # the seventh session's LLaVA trace (serve-gpu.json) never reached the bound: the same
    results = Path(__file__).parents[1] / "results" / "serve-gpu.json"
    recorded = json.loads(results.read_text())["shapes"]["llava7b"]["trace_composition"]
    assert composition(build_trace(recorded["requests"], seed=0)) == recorded


def test_kinds_are_what_they_say() -> None:
    trace = build_trace(1500, seed=3)
    firsts = {(r.image.base, r.question): r for r in trace if r.kind in ("new", "followup")}
    for r in trace:
        if r.kind == "repeat":
            assert (r.image.base, r.question) in firsts and r.image.variant == "png"
        elif r.kind in ("jpeg", "frame"):
            assert r.image.variant == r.kind and (r.image.base, r.question) in firsts
        elif r.kind == "paraphrase":
            assert r.image.variant == "png"
            assert (r.image.base, r.question) not in firsts  # reworded
    assert image_data_url(ImageSpec(1, "jpeg", 80), 0).startswith("data:image/jpeg")
    assert image_data_url(ImageSpec(1, "frame", 2), 0) != image_data_url(ImageSpec(1), 0)


def test_mix_flag_changes_the_composition_and_names_bad_keys() -> None:
    heavy = composition(build_trace(2000, 0, parse_mix("repeat=0.6")))
    assert heavy["exact_repeat_share"] > 0.4
    assert parse_mix(None) == pytest.approx(DEFAULT_MIX)
    with pytest.raises(ValueError, match="unknown kind 'repat'"):
        parse_mix("repat=0.5")
    with pytest.raises(ValueError, match="repeat must be >= 0"):
        parse_mix("repeat=-1")


def test_poisson_schedule_rate_and_spacing() -> None:
    offs = poisson_offsets(50.0, 200.0, np.random.default_rng(1))
    assert offs == sorted(offs) and offs[-1] < 200.0
    assert len(offs) / 200.0 == pytest.approx(50.0, rel=0.05)
    gaps = np.diff(offs)
    assert np.mean(gaps) == pytest.approx(0.02, rel=0.05)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, abs=0.08)  # exponential: cv 1
    with pytest.raises(ValueError):
        poisson_offsets(0, 10, np.random.default_rng(0))


def _row(i: int, ttft: float | None, e2e: float, tier: str | None = "miss",
         status: int = 200) -> dict[str, object]:
    return {"i": i, "kind": "new", "status": status, "ttft_ms": ttft, "e2e_ms": e2e,
            "tier": tier, "tokens": 10}


def test_summary_goodput_counts_only_requests_within_both_slos() -> None:
    rows = [_row(0, 100, 500), _row(1, 900, 1200, "response"),  # both met
            _row(2, 1500, 1600),          # TTFT over
            _row(3, 200, 3500),           # e2e over
            _row(4, None, 50, status=500)]  # error
    s = summarize(rows, wall_s=2.0, slo=Slo(ttft_ms=1000, e2e_ms=3000))
    assert s["answered"] == 4 and s["errors"] == 1
    assert s["throughput_rps"] == 2.0 and s["goodput_rps"] == 1.0
    assert s["hits_by_tier"] == {"miss": 3, "response": 1}
    assert s["ttft_by_tier_ms"]["response"] == {"p50": 900.0, "p99": 900.0}
    assert s["ttft_by_tier_ms"]["miss"]["p50"] == 200.0
    assert s["ttft_miss_p50_ms"] == 200.0  # rows 0, 2, 3
    plain = summarize([_row(0, 110, 600, None), _row(1, 300, 900, None)], 1.0, Slo(),
                      miss_ids=miss_ids(rows))
    assert plain["ttft_miss_p50_ms"] == 110.0  # only request 0: the cache's misses answered
    assert plain["hits_by_tier"] == {"engine": 2}


def test_verdict_reads_best_goodput_and_lowest_rate_miss_ttft() -> None:
    def side(good: float, miss: float, share: float = 1.0) -> dict[str, float]:
        return {"goodput_rps": good, "ttft_miss_p50_ms": miss, "slo_met_share": share}

    rates = [{"rate": 4, "ours": side(4, 52), "plain": side(4, 50)},
             {"rate": 20, "ours": side(19, 60), "plain": side(10, 90)},
             {"rate": 40, "ours": side(30, 80, 0.75), "plain": side(12, 400, 0.3)}]
    v = verdict(rates)
    assert v["best_goodput_ratio"] == 2.5 and v["goodput_2x_met"]
    assert v["lowest_rate_ttft_miss_ratio"] == 1.04 and v["ttft_miss_1_05x_met"]
    # 40 req/s left a quarter of ours' requests outside the SLO: not counted there
    assert v["best_goodput_attained_rps"] == {"ours": 19, "plain": 10}
    assert v["best_goodput_attained_ratio"] == 1.9


async def _fake_sse(scope, receive, send) -> None:  # type: ignore[no-untyped-def]
    """An OpenAI-like streaming server: the role chunk at once, 0.2 s to the first of 3
    tokens, 0.3 s more to the finish, then usage and a report. Path /blank: the tokens' text
    is empty (dummy weights); /usage: empty too, with vLLM's continuous usage stats."""
    import asyncio
    import json

    path = scope["path"]
    text = "x" if path.startswith("/v1") else ""

    def usage(n: int) -> dict[str, object]:
        return {"usage": {"completion_tokens": n}} if path.startswith("/usage") else {}

    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"text/event-stream"), (b"x-vlmcache-hit-tier", b"image")]})
    plan = [(0.0, {"choices": [{"delta": {"role": "assistant", "content": ""}}], **usage(0)}),
            *((0.2 if k == 0 else 0.0, {"choices": [{"delta": {"content": text}}],
                                        **usage(k + 1)}) for k in range(3)),
            (0.3, {"choices": [{"delta": {}, "finish_reason": "length"}], **usage(3)}),
            (0.0, {"choices": [], "usage": {"completion_tokens": 3, "prompt_tokens_details":
                                            {"cached_tokens": 64}}}),
            (0.0, {"choices": [], "vlmcache": {"hit_tier": "image", "front_ms": {
                "decode": 1.5, "cascade": 2.5}}})]
    for delay, chunk in plan:
        await asyncio.sleep(delay)
        data = b"data: " + json.dumps(chunk).encode() + b"\n\n"
        await send({"type": "http.response.body", "body": data, "more_body": True})
    await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})


def test_run_phase_is_open_loop_and_reads_ttft_tier_and_tokens() -> None:
    import asyncio
    import threading
    import time

    import uvicorn

    from vlmcache.testing.server import free_port
    from vlmcache_lab.serve_gpu_load import run_phase

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(_fake_sse, host="127.0.0.1", port=port,
                                           log_level="error"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    try:
        offsets = [0.05 * k for k in range(10)]
        rows, wall = asyncio.run(run_phase(f"http://127.0.0.1:{port}", [{}] * 10,
                                           ["new"] * 10, offsets, drain_s=10))
        blank, _ = asyncio.run(run_phase(f"http://127.0.0.1:{port}/blank", [{}] * 3,
                                         ["new"] * 3, [0.0, 0.01, 0.02], drain_s=10))
        usage, _ = asyncio.run(run_phase(f"http://127.0.0.1:{port}/usage", [{}] * 3,
                                         ["new"] * 3, [0.0, 0.01, 0.02], drain_s=10))
    finally:
        server.should_exit = True
        thread.join()
    assert [r["i"] for r in rows] == list(range(10))
    assert all(r["status"] == 200 and r["tier"] == "image" and r["tokens"] == 3 for r in rows)
    assert all(200 <= r["ttft_ms"] < 450 and r["e2e_ms"] >= 500 for r in rows)
    assert {r["ttft_by"] for r in rows} == {"content"}
    assert all(r["cached_tokens"] == 64 and r["front_ms"] == 4.0 for r in rows)
    breakdown = summarize(rows, 1.0, Slo(), miss_ids={0, 1})
    assert (breakdown["miss_front_ms_p50"], breakdown["miss_cached_tokens_mean"]) == (4.0, 64.0)
    assert breakdown["miss_front_stages_ms"] == {"cascade": {"p50": 2.5, "p99": 2.5},
                                                 "decode": {"p50": 1.5, "p99": 1.5}}
    assert wall < 2.0  # closed loop one at a time would take >= 5 s
    # no visible text, no usage: answered, TTFT at the finish chunk
    assert all(r["status"] == 200 and r["ttft_ms"] >= 500 and r["ttft_by"] == "finish"
               for r in blank)
    # no visible text, continuous usage (the GPU run's dummy Qwen2-VL): the first token
    assert all(200 <= r["ttft_ms"] < 450 and r["ttft_by"] == "usage" for r in usage)
    assert summarize(usage, 1.0, Slo())["ttft_by"] == {"usage": 3}


def test_first_token_mark_skips_the_role_chunk_and_usage_only_chunks() -> None:
    from vlmcache_lab.serve_gpu_load import first_token_mark

    role = {"choices": [{"delta": {"role": "assistant", "content": ""}}],
            "usage": {"completion_tokens": 0}}
    assert first_token_mark(role) is None
    assert first_token_mark({"choices": [], "usage": {"completion_tokens": 5}}) is None
    assert first_token_mark({"choices": [{"delta": {"content": ""}}],
                             "usage": {"completion_tokens": 1}}) == "usage"
    assert first_token_mark({"choices": [{"text": "a"}]}) == "content"
    assert first_token_mark({"choices": [{"delta": {}, "finish_reason": "stop"}]}) == "finish"


def test_front_capacity_bodies_reach_the_tier_they_measure() -> None:
    from vlmcache_lab.front_capacity import tier_bodies

    misses = tier_bodies("miss", "m", 0, 20, 100)
    urls = [b["messages"][0]["content"][0]["image_url"]["url"] for b in misses]
    assert len(set(urls)) == 20  # every miss a new image
    for tier in ("exact", "image"):  # the response tier is skipped, else repeats hit it
        assert all(b["vlmcache"] == {"response_cache": False}
                   for b in tier_bodies(tier, "m", 0, 40, 0))
    assert all("vlmcache" not in b and not b["stream"]
               for b in tier_bodies("response", "m", 0, 40, 0))


def test_merge_keeps_each_shapes_trace_and_the_notes(tmp_path: Path) -> None:
    import json

    from vlmcache_lab.serve_gpu import merge

    files = []
    for shape, n in (("a", 10), ("b", 20)):
        doc = {"command": f"run {shape}", "device": "gpu", "trace": {"seed": 0,
               "composition": {"requests": n}}, "shapes": {shape: {"rates": []}}}
        files.append(tmp_path / f"{shape}.json")
        files[-1].write_text(json.dumps(doc))
    out = merge([str(f) for f in files], ["--merge", "x", "--note", "n1"], ["n1"])
    assert out["commands"] == ["run a", "run b"] and out["notes"] == ["n1"]
    assert out["shapes"]["b"]["trace_composition"] == {"requests": 20}
    assert "composition" not in out["trace"] and "n1" not in out["merged_by"]


def _args(tmp_path: Path, **over: object) -> object:
    from vlmcache_lab.serve_gpu import parse_args

    args = parse_args(["--geometry", str(tmp_path / "model"), "--rates", "4,8"])
    for k, v in over.items():
        setattr(args, k, v)
    return args


def test_the_oracle_answers_what_was_answered_before_and_sends_the_rest(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import asyncio

    from vlmcache_lab import serve_gpu_load
    from vlmcache_lab.serve_gpu_trace import ANSWERED_BEFORE

    sent: list[tuple[list[str], list[float]]] = []

    async def fake_run_phase(url, bodies, kinds, offsets, drain_s):  # type: ignore[no-untyped-def]
        sent.append((list(kinds), list(offsets)))
        rows = [{"i": k, "kind": kind, "status": 200, "ttft_ms": 80.0, "e2e_ms": 300.0,
                 "tier": None, "tokens": 8} for k, kind in enumerate(kinds)]
        rows[-1] = {**rows[-1], "status": -1, "ttft_ms": None}  # one failed
        return rows, 2.5

    monkeypatch.setattr(serve_gpu_load, "run_phase", fake_run_phase)
    kinds = ["new", "repeat", "followup", "jpeg", "paraphrase", "flood", "frame"]
    offsets = [0.0, 0.5, 1.0, 1.5, 2.0, 2.5, 3.0]
    rows, wall = asyncio.run(serve_gpu_load.oracle_phase(
        "http://x", [{"n": k} for k in range(7)], kinds, offsets, 5.0, ANSWERED_BEFORE))
    assert sent == [(["new", "followup", "flood"], [0.0, 1.0, 2.5])]  # their own times
    assert [r["i"] for r in rows] == list(range(7)) and wall == 3.0  # the last arrival
    assert [r["tier"] for r in rows] == ["miss", "response", "miss", "response", "response",
                                         None, "response"]
    assert all(r["ttft_ms"] == 0.0 for r in rows if r["tier"] == "response")
    s = summarize(rows, wall, Slo())
    assert s["hits_by_tier"] == {"miss": 2, "response": 4} and s["errors"] == 1
    assert miss_ids(rows) == {0, 2}  # plain's miss TTFT is taken on the same requests


def test_oracle_layout_is_a_second_plain_server(tmp_path: Path) -> None:
    from vlmcache_lab.serve_gpu_servers import make_servers

    servers = make_servers(_args(tmp_path, ours_layout="oracle", paraphrase="off"), tmp_path)
    ours, plain = servers["ours"].argv, servers["plain"].argv  # type: ignore[attr-defined]
    assert "vllm.entrypoints.openai.api_server" in ours and "serve" not in ours
    port = ours.index("--port") + 1
    assert ours[:port] + ours[port + 1:] == plain[:port] + plain[port + 1:]


def test_proxy_layout_puts_the_front_before_a_frontless_serve_and_keeps_plain(
        tmp_path: Path) -> None:
    from vlmcache_lab.serve_gpu_servers import ProxiedServer, make_servers

    inproc = make_servers(_args(tmp_path, paraphrase="off"), tmp_path)
    proxied = make_servers(_args(tmp_path, ours_layout="proxy", paraphrase="off"), tmp_path)
    ours = proxied["ours"]
    assert isinstance(ours, ProxiedServer) and ours.url == ours.proxy.url
    engine, proxy = ours.engine.argv, ours.proxy.argv
    assert engine[engine.index("serve") + 2] == "--vlmcache-no-front"
    assert "--vlmcache-no-front" not in inproc["ours"].argv  # type: ignore[attr-defined]
    assert proxy[proxy.index("proxy") + 1] == str(tmp_path / "model")
    assert proxy[proxy.index("--upstream") + 1] == ours.engine.url
    sets = {proxy[k + 1] for k, a in enumerate(proxy) if a == "--vlmcache-set"}
    assert f"store_path={tmp_path / 'store'}" in sets and "enable_semantic_text=false" in sets
    strip = {inproc["plain"].port, proxied["plain"].port}  # type: ignore[attr-defined]
    plain = [[a for a in s["plain"].argv if a not in {str(p) for p in strip}]  # type: ignore
             for s in (inproc, proxied)]
    assert plain[0] == plain[1]  # the baseline is the same in both layouts
    assert proxy[proxy.index("--workers") + 1] == "1" and ours.redis is None


def test_proxy_workers_share_a_redis_the_engine_does_not_use(tmp_path: Path) -> None:
    from vlmcache_lab.serve_gpu_servers import make_servers

    ours = make_servers(_args(tmp_path, ours_layout="proxy", paraphrase="off",
                              proxy_workers=4), tmp_path)["ours"]
    proxy = ours.proxy.argv  # type: ignore[attr-defined]
    assert proxy[proxy.index("--workers") + 1] == "4"
    sets = {proxy[k + 1] for k, a in enumerate(proxy) if a == "--vlmcache-set"}
    assert f"redis_url={ours.redis.url}" in sets  # type: ignore[attr-defined]
    assert not any("redis" in a for a in ours.engine.argv)  # type: ignore[attr-defined]


def test_paraphrase_follows_the_embedder_unless_forced(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from vlmcache_lab import serve_gpu_servers as sgs

    monkeypatch.setattr(sgs, "text_embedder_path", lambda: None)
    assert sgs.ours_config(_args(tmp_path))["enable_semantic_text"] is False
    assert sgs.ours_config(_args(tmp_path, paraphrase="on"))["enable_semantic_text"] is True
    monkeypatch.setattr(sgs, "text_embedder_path", lambda: tmp_path)
    assert sgs.ours_config(_args(tmp_path))["enable_semantic_text"] is True
    forced = _args(tmp_path, ours_config='{"enable_semantic_text": false}')
    assert sgs.ours_config(forced)["enable_semantic_text"] is False


def test_rates_that_might_not_fit_the_budget_are_skipped(tmp_path: Path) -> None:
    import time

    from vlmcache_lab.serve_gpu import rate_cost_s, run_rates

    args = _args(tmp_path, phase_s=10.0, drain_s=8.0, pause_s=3.0)
    assert rate_cost_s(args) == 42.0
    rates, trace, skipped = run_rates(args, {}, time.monotonic() + 41.0)
    assert rates == [] and trace == [] and skipped == [4.0, 8.0]


def test_prompt_tokens_split_by_where_they_came_from():
    from vlmcache_lab.serve_gpu_load import token_summary

    rows = [  # a stored answer, an exact hit with a KV load, plain rows (no report)
        {"tier": "response", "usage_prompt_tokens": 600, "cached_tokens": 0},
        {"tier": "miss", "usage_prompt_tokens": 600, "cached_tokens": 576,
         "tokens_loaded": 512, "tokens_from_prefix_cache": 64},
        {"tier": None, "usage_prompt_tokens": 600, "cached_tokens": 576},
        {"tier": None, "usage_prompt_tokens": 600},
    ]
    assert token_summary(rows) == {"total": 2400, "response_tier": 600,
                                   "prefix_cache": 64 + 576, "loaded": 512,
                                   "computed": 2400 - 600 - 640 - 512}


def test_gpu_busy_reads_nvidia_smi_samples_and_is_none_without_it(monkeypatch):
    from vlmcache_lab.gpu_busy import GpuBusy, mean_utilization

    assert mean_utilization(["50\n", "100\n", "[N/A]\n", "0\n"]) == (50.0, 3)
    assert mean_utilization(["[N/A]"]) is None
    monkeypatch.setattr("shutil.which", lambda name: None)
    with GpuBusy() as gpu:
        pass
    assert gpu.result() is None


def test_gpu_busy_samples_while_the_block_runs(tmp_path, monkeypatch):
    import time

    from vlmcache_lab.gpu_busy import GpuBusy

    fake = tmp_path / "nvidia-smi"  # prints a utilization every 20 ms, as -lms does
    fake.write_text("#!/bin/sh\nwhile true; do echo 80; sleep 0.02; done\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{__import__('os').environ['PATH']}")
    with GpuBusy() as gpu:
        time.sleep(0.5)
    figures = gpu.result()
    assert figures is not None and figures["utilization_pct"] == 80.0
    assert figures["samples"] >= 5 and 0.35 <= figures["busy_s"] <= 0.6


def test_engine_metrics_give_the_phases_means_from_vllms_histograms():
    from vlmcache_lab.engine_metrics import parse_sums, phase_means

    def text(ttft_sum, ttft_n, queue_sum, prefill_sum, n):
        return "\n".join([
            "# HELP vllm:time_to_first_token_seconds Histogram of time to first token",
            f'vllm:time_to_first_token_seconds_sum{{engine="0",model_name="m"}} {ttft_sum}',
            f'vllm:time_to_first_token_seconds_count{{engine="0",model_name="m"}} {ttft_n}',
            f'vllm:time_to_first_token_seconds_bucket{{le="0.1",model_name="m"}} {ttft_n}',
            f'vllm:request_queue_time_seconds_sum{{model_name="m"}} {queue_sum}',
            f'vllm:request_queue_time_seconds_count{{model_name="m"}} {n}',
            f'vllm:request_prefill_time_seconds_sum{{model_name="m"}} {prefill_sum}',
            f'vllm:request_prefill_time_seconds_count{{model_name="m"}} {n}',
            'vllm:num_requests_running{model_name="m"} 3.0'])

    before = parse_sums(text(1.0, 10, 0.5, 0.2, 10))
    assert before["vllm:time_to_first_token_seconds_count"] == 10
    after = parse_sums(text(3.0, 20, 0.7, 0.6, 20))
    assert phase_means(before, after) == {"ttft_mean_ms": 200.0, "queue_mean_ms": 20.0,
                                          "prefill_mean_ms": 40.0, "requests": 10,
                                          # ten more under 100 ms: the median halfway there
                                          "ttft_p50_ms": 50.0, "queue_p50_ms": None,
                                          "prefill_p50_ms": None}
    assert phase_means(before, None) is None
    none = phase_means(before, before)  # no engine request in the phase (all cached)
    assert none["requests"] == 0 and none["ttft_mean_ms"] is None


def test_engine_median_is_not_moved_by_one_request_without_timestamps():
    from vlmcache_lab.engine_metrics import parse_sums, phase_means

    def text(counts: tuple[int, int, int], total: float) -> str:
        metric = "vllm:request_prefill_time_seconds"
        cumulative = [counts[0], counts[0] + counts[1], sum(counts)]
        return "\n".join([
            "# TYPE vllm:request_prefill_time_seconds histogram",
            *(f'{metric}_bucket{{le="{le}",model_name="m"}} {c}'
              for le, c in zip(("0.1", "0.3", "+Inf"), cumulative)),
            f'{metric}_sum{{model_name="m"}} {total}',
            f'{metric}_count{{model_name="m"}} {sum(counts)}'])

    before = parse_sums(text((0, 0, 0), 0.0))
    # 8 prefills of 0.1-0.3 s, 2 under 0.1 s and one whose scheduled time vLLM lost (its
    # prefill "took" the engine's uptime, 950 s): the mean says 87 s, the median 0.19 s
    after = parse_sums(text((2, 8, 1), 950.0 + 1.6))
    means = phase_means(before, after)
    assert means["prefill_mean_ms"] > 80_000
    assert means["prefill_p50_ms"] == 187.5  # 5.5 of 11: 3.5 of the 8 in (0.1, 0.3]


def test_engine_metrics_count_the_fronts_video_handoff_by_outcome():
    from vlmcache_lab.engine_metrics import parse_sums, phase_means

    def text(kept, taken, decoded):
        return "\n".join([
            "# TYPE vlmcache_video_handoff counter",
            f'vlmcache_video_handoff_total{{outcome="kept"}} {kept}',
            f'vlmcache_video_handoff_total{{outcome="taken"}} {taken}',
            f'vlmcache_video_handoff_total{{outcome="decoded"}} {decoded}'])

    before = parse_sums(text(2, 2, 1))
    after = parse_sums(text(8, 7, 2))
    assert phase_means(before, after)["video_handoff"] == {"kept": 6, "taken": 5,
                                                          "decoded": 1}
    assert "video_handoff" not in phase_means({}, {})  # plain vLLM: no such counter


def test_the_engine_behind_ours_proxy_is_where_its_metrics_are():
    from types import SimpleNamespace

    from vlmcache_lab.serve_gpu_servers import engine_url

    proxied = SimpleNamespace(url="http://p", engine=SimpleNamespace(url="http://e"))
    assert engine_url(proxied) == "http://e"
    assert engine_url(SimpleNamespace(url="http://plain")) == "http://plain"


def test_a_server_that_lost_the_memory_profiling_race_starts_again_alone() -> None:
    from vlmcache_lab.serve_gpu_servers import KV_MEMORY_RACE, start_servers

    class Fake:
        def __init__(self, failures: list[str]) -> None:
            self.failures, self.starts, self.stops = failures, 0, 0

        def start(self) -> None:
            self.starts += 1
            if self.failures:
                raise RuntimeError(self.failures.pop(0))

        def stop(self) -> None:
            self.stops += 1

    ok, raced = Fake([]), Fake([f"server exited (1): ValueError: {KV_MEMORY_RACE}."])
    took = start_servers({"plain": ok, "ours": raced})
    assert set(took) == {"plain", "ours"} and (ok.starts, raced.starts) == (1, 2)
    # any other failure (or a race that recurs) stops them all and raises
    broken = Fake(["server exited (1): bad flag"])
    with pytest.raises(RuntimeError, match="bad flag"):
        start_servers({"plain": Fake([]), "ours": broken})
    again = Fake([KV_MEMORY_RACE, KV_MEMORY_RACE])
    with pytest.raises(RuntimeError, match=KV_MEMORY_RACE):
        start_servers({"plain": Fake([]), "ours": again})
    assert again.starts == 2


def test_a_kept_overlap_counts_only_the_front_time_before_the_engine_started() -> None:
    import json

    from vlmcache_lab.serve_gpu_load import _on_line, summarize

    def row(i: int, overlap: str | None) -> dict:
        r = {"i": i, "status": 200, "ttft_ms": 100.0, "e2e_ms": 200.0, "tier": None,
             "kind": "new"}
        report = {"hit_tier": None, "front_ms": {"decode": 2.0, "response_lookup": 0.5,
                                                 "miss_body": 0.1, "cascade": 4.0,
                                                 "rewrite": 0.1}}
        if overlap is not None:
            report["miss_overlap"] = overlap
        _on_line(r, "data: " + json.dumps({"choices": [], "vlmcache": report}), 0.0)
        return r

    kept, dropped, plain = row(0, "kept"), row(1, "dropped"), row(2, None)
    assert kept["front_ms"] == pytest.approx(2.6)  # the cascade and rewrite ran beside it
    assert dropped["front_ms"] == pytest.approx(6.7) == plain["front_ms"]
    out = summarize([kept, dropped, plain], 1.0, Slo())
    assert out["overlaps"] == {"dropped": 1, "kept": 1}
    assert out["miss_overlap"] == {"None": 1, "dropped": 1, "kept": 1}


def test_held_media_outcomes_are_counted_per_side() -> None:
    import json

    from vlmcache_lab.serve_gpu_load import _on_line, summarize

    def row(i: int, held: str | None) -> dict:
        r = {"i": i, "status": 200, "ttft_ms": 100.0, "e2e_ms": 200.0, "tier": None,
             "kind": "followup"}
        report = {"hit_tier": None, **({"held_media": held} if held else {})}
        _on_line(r, "data: " + json.dumps({"choices": [], "vlmcache": report}), 0.0)
        return r

    out = summarize([row(0, "elided"), row(1, "elided"), row(2, "resent"), row(3, None)],
                    1.0, Slo())
    assert out["held_media"] == {"elided": 2, "resent": 1}
