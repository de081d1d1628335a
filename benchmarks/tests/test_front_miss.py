"""The front's in-process miss benchmark runs and names its stages."""

import json


def test_a_tiny_run_writes_the_stages(tmp_path):
    from vlmcache_lab.front_miss import main, miss_bodies

    bodies = miss_bodies("m", 3, True)
    texts = [p["text"] for b in bodies for p in b["messages"][0]["content"]
             if p["type"] == "text"]
    assert len(set(texts)) == 3
    out = tmp_path / "f.json"
    assert main(["--requests", "4", "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert {"decode", "cascade"} <= set(result["stages_ms"]) and result["requests"] == 4
