"""The chaos harness: its bookkeeping on synthetic data, and a short live run (one fault
kind against a real `vlmcache serve`)."""

from __future__ import annotations

import json

import pytest

from vlmcache_lab import chaos


def _row(i, status=200, answer="red", tier=None, error=None):
    return {"i": i, "kind": "k", "status": status, "answer": answer, "tier": tier,
            "reuse": {"tokens_loaded": 32, "images_loaded": 1}, "error": error}


def test_score_counts_5xx_failures_and_wrong_answers():
    run = chaos.FaultRun("kv_chunks_damaged")
    rows = [_row(0), _row(1, answer="blue"), _row(2, status=503, answer=None, error="x"),
            _row(3, status=-1, answer=None, error="reset"), _row(4, tier="text:exact")]
    chaos.score(run, rows, {0: "red", 1: "red", 2: "red", 3: "red", 4: "red"})
    assert (run.requests, run.errors_5xx, run.errors_other, run.wrong_answers) == (5, 1, 1, 1)
    assert run.hits_by_tier == {"miss": 2, "text:exact": 1}
    assert run.reuse == {"tokens_loaded": 96, "images_loaded": 3}
    assert run.why_errors.startswith("unexplained")  # no kind explains a 5xx on its own


def test_an_expected_failure_says_why():
    run = chaos.FaultRun("engine_crash_restart")
    chaos.score(run, [_row(0, status=-1, answer=None, error="reset")], {0: "red"})
    assert run.errors_other == 1 and "connection reset" in run.why_errors


def test_acked_losses_come_from_dead_writers_journals_and_the_store(tmp_path):
    journal = tmp_path / "kv" / "journal"
    journal.mkdir(parents=True)
    (journal / "1.intent").write_text("+a\n+b\n-a\n+c\n+d\n")  # b, c, d never written
    (journal / "2.intent").write_text("+e\n-e\n")
    chunk = tmp_path / "kv" / "chunks" / "c0"
    chunk.mkdir(parents=True)
    (chunk / "c.safetensors").write_bytes(b"x")  # c landed after all
    pending = chaos.pending_acks(tmp_path)
    assert pending == {tmp_path / "kv": {"b", "c", "d"}}
    assert chaos.acked_lost(pending) == 2


def test_the_start_log_report_is_read():
    log = ("WARNING vlmcache: 3 acknowledged chunk writes to /s/encoder were lost in a crash "
           "(journals a.intent); they are misses now\n"
           "WARNING vlmcache: 2 acknowledged KV row writes to /s/kv were lost in a crash\n")
    assert chaos.reported_losses(log) == 5


@pytest.mark.vllm
def test_a_short_live_run_keeps_answers_and_the_server(tmp_path):
    out = tmp_path / "chaos.json"
    code = chaos.main(["--requests", "24", "--pool", "6", "--concurrency", "4",
                       "--kinds", "encoder_chunks_damaged", "--tmpfs-mib", "128",
                       "--work", str(tmp_path / "work"), "--out", str(out)])
    record = json.loads(out.read_text())
    (run,) = record["runs"]
    assert code == 0, run
    assert record["reference_pass"]["errors_5xx"] == 0
    assert run["requests"] == 24 and run["errors_5xx"] == 0 and run["wrong_answers"] == 0
    assert run["server_alive_after"] and run["loss_reported"]
    assert run["injected"].endswith("removed")
