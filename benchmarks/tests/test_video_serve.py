"""The video serving benchmark's pieces that need no server."""

from __future__ import annotations

from types import SimpleNamespace

from vlmcache_lab.video_requests import _on_line, body
from vlmcache_lab.video_serve import (answers_equal, compact_rows, make_server, summarize,
                                      vllm_flags)

ARGS = SimpleNamespace(model="/m", frames=8, step=2, stream_requests=3, text_before_video=4,
                       max_tokens=8, max_model_len=2048, dummy_weights=False,
                       gpu_memory_utilization=0.6, max_num_batched_tokens=8192)


def _row(e2e, ttft, cached=0, text="a", report=None):
    return {"e2e_ms": e2e, "ttft_ms": ttft, "cached_tokens": cached, "prompt_tokens": 540,
            "text": text, "report": report}


def test_plain_gets_the_same_vllm_flags_without_the_front(tmp_path):
    plain = make_server("plain", ARGS, tmp_path, "p")
    ours = make_server("ours", ARGS, tmp_path, "o")
    assert plain.argv[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert "--middleware" not in plain.argv and "--vlmcache-set" not in plain.argv
    for flag in vllm_flags(ARGS):
        assert flag in plain.argv and flag in ours.argv
    assert '{"video": {"num_frames": 8}}' in plain.argv
    assert plain.argv[-4:] == ["--gpu-memory-utilization", "0.6",
                               "--max-num-batched-tokens", "8192"]


def test_stream_lines_give_ttft_text_usage_and_the_report():
    row = {"ttft_ms": None, "text": "", "report": None, "cached_tokens": 0, "prompt_tokens": 0}
    _on_line(row, 'data: {"choices": [{"delta": {"role": "assistant", "content": ""}}]}', 0.0)
    assert row["ttft_ms"] is None  # the role chunk is not a token
    _on_line(row, 'data: {"choices": [{"delta": {"content": "red"}}]}', 0.0)
    _on_line(row, 'data: {"choices": [], "usage": {"prompt_tokens": 540, '
                  '"prompt_tokens_details": {"cached_tokens": 512}}}', 0.0)
    _on_line(row, 'data: {"vlmcache": {"hit_tier": "response"}}', 0.0)
    _on_line(row, "data: [DONE]", 0.0)
    assert row["text"] == "red" and row["ttft_ms"] is not None
    assert (row["prompt_tokens"], row["cached_tokens"]) == (540, 512)
    assert row["report"] == {"hit_tier": "response"}


def test_summary_fields_and_frames_reused_count_whole_frames_past_the_text():
    report = {"images_loaded": 1, "tokens_loaded": 512, "hit_tier": None}
    rows = {"miss": [_row(100, 50), _row(120, 60)],
            "reencoded": [_row(30, 10, 512, report=report)] * 2,
            "followup": [_row(35, 15, 512, report=report)] * 2,
            "restart_followup": [_row(40, 20, 512, report=report)] * 2,
            "stream": [_row(100, 50), _row(90, 45, 4 + 64 * 5 + 10), _row(90, 40, 3)]}
    out = summarize(rows, ARGS, 64)
    assert "engine" not in out  # no /metrics view recorded
    engine = {"miss": {"ttft_mean_ms": 80.0, "video_handoff": {"kept": 2, "taken": 2}}}
    assert summarize({**rows, "engine": engine}, ARGS, 64)["engine"] == engine
    assert "engine" not in compact_rows({**rows, "engine": engine})
    assert out["miss_ms"] == 110 and out["reencoded_ms"] == 30 and out["followup_ms"] == 35
    assert out["encoder_outputs_loaded"] == 2 and out["tokens_loaded"] == 1024
    assert out["stream"]["frames_reused"] == [5, 0] and out["stream"]["ttft_p50_ms"] == 42.5


def test_answers_equal_per_phase_and_the_request_body():
    ours = {p: [_row(1, 1, text="x"), _row(1, 1, text="y")]
            for p in ("miss", "reencoded", "followup", "restart_followup")}
    plain = {p: [_row(1, 1, text="x"), _row(1, 1, text="z")]
             for p in ("miss", "reencoded", "followup", "restart_followup")}
    assert answers_equal(ours, plain) == {"miss": 0.5, "reencoded": 0.5, "followup": 0.5,
                                          "restart_followup": 0.5}
    b = body(ARGS, b"clip", "mp4v", "q?", "acme")
    part = b["messages"][0]["content"][0]
    assert part["video_url"]["url"].startswith("data:video/mp4;base64,") and b["stream"]


def test_a_stream_that_fails_after_its_200_is_an_error_not_a_row():
    import pytest

    row = {"ttft_ms": None, "text": "", "report": None, "cached_tokens": 0, "prompt_tokens": 0}
    with pytest.raises(RuntimeError, match="stream error"):
        _on_line(row, 'data: {"error": {"message": "exceeds the encoder cache"}}', 0.0)


def test_paired_turns_alternate_the_first_server_and_keep_payload_order(monkeypatch):
    import vlmcache_lab.video_serve as vs

    sent = []
    monkeypatch.setattr(vs, "ask", lambda url, payload: sent.append((url, payload["n"]))
                        or {"url": url, "n": payload["n"]})
    rows = vs.phase({"plain": "P", "ours": "O"}, [{"n": 0}, {"n": 1}, {"n": 2}])
    assert sent == [("P", 0), ("O", 0), ("O", 1), ("P", 1), ("P", 2), ("O", 2)]
    assert [r["n"] for r in rows["ours"]] == [0, 1, 2]
    assert {r["url"] for r in rows["plain"]} == {"P"}


def test_paired_ratios_are_medians_of_per_request_ratios():
    from vlmcache_lab.video_serve import paired_ratios

    phases = ("miss", "reencoded", "followup", "restart_followup")
    plain = {p: [_row(100, 1), _row(200, 1), _row(400, 1)] for p in phases}
    ours = {p: [_row(110, 1), _row(180, 1), _row(1000, 1)] for p in phases}
    ratios = paired_ratios({"ours": ours, "plain": plain})
    assert ratios["miss_ms"] == 1.1 and set(ratios) == {f"{p}_ms" for p in phases}


def test_ours_config_overrides_reach_ours_server_only(tmp_path):
    args = SimpleNamespace(**vars(ARGS), ours_config='{"encoder_cache_v1_runner": false}')
    ours = make_server("ours", args, tmp_path, "o")
    sets = [ours.argv[i + 1] for i, a in enumerate(ours.argv) if a == "--vlmcache-set"]
    assert "encoder_cache_v1_runner=false" in sets
    assert "enable_video_near_duplicates=true" in sets  # the rest of OURS_CONFIG stays
    default = make_server("ours", ARGS, tmp_path, "d")
    assert "encoder_cache_v1_runner=true" in [default.argv[i + 1] for i, a in
                                               enumerate(default.argv) if a == "--vlmcache-set"]
