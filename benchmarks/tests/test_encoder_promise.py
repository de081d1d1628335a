import json

from vlmcache_lab import encoder_promise


def test_both_answers_are_timed_and_written(tmp_path, monkeypatch):
    monkeypatch.setattr(encoder_promise, "SHAPES", (("small", 64, 32),))
    out = tmp_path / "r.json"
    assert encoder_promise.main(["--repeats", "3", "--out", str(out)]) == 0
    row = json.loads(out.read_text())["shapes"]["small"]
    assert row["mb"] == 0.0 and row["read_and_verify_ms"] > 0 and row["index_ms"] > 0
