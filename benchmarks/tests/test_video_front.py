"""The video first-sight benchmark runs and every clip is a miss."""

import json


def test_a_tiny_run_writes_its_figures(tmp_path):
    from vlmcache_lab.video_front import main

    out = tmp_path / "v.json"
    assert main(["--clips", "3", "--frames", "6", "--size", "64", "--repeats", "1",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["hits"] == 0 and len(result["per_clip_best"]) == 3
    summary = result["median_after_the_first_clip"]
    assert summary["request_path_ms"] == round(summary["decode_ms"] + summary["lookup_ms"], 2)
