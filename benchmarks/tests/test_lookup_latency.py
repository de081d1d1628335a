"""Lookup-latency benchmark at a tiny size (a hashed bag-of-words stands in for MiniLM)."""

from __future__ import annotations

import json

from vlmcache_lab import lookup_latency
from vlmcache.testing.text_embedder import HashedBagOfWords


def test_tiny_run_writes_every_field(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("vlmcache.embedders.make_text_embedder",
                        lambda name: HashedBagOfWords(384))
    out = tmp_path / "lookup.json"
    lookup_latency.main(["--entries", "500", "--queries", "3", "--hnsw-threshold", "200",
                         "--out", str(out)])
    record = json.loads(out.read_text())
    for key in ("command", "device", "entries_per_tier", "indexes", "scenarios", "notes"):
        assert key in record
    assert record["command"].startswith("python benchmarks/lookup_latency.py --entries 500")
    assert record["device"]["cores"] >= 1 and record["device"]["cpu"]
    assert record["indexes"]["exact_text"]["entries"] == 500
    assert record["indexes"]["embedding:vision"]["kind"].startswith("HNSW")
    assert all(v["entries"] > 500 for k, v in record["indexes"].items() if k != "exact_text")
    run = record["runs"][0]
    assert run["entries"] == 500 and run["resolve_p50_ms"] > 0 and run["embed_p50_ms"] > 0
    for name in ("hit", "miss"):
        scenario = record["scenarios"][name]
        assert sum(scenario["hit_tiers"].values()) == 3
        for row in lookup_latency.ROWS:
            assert scenario[f"{row}_ms"]["p50"] > 0
            assert scenario[f"{row}_ms"]["p90"] >= scenario[f"{row}_ms"]["p50"]
    assert record["scenarios"]["hit"]["hit_tiers"].get("None", 0) < 3  # near-duplicates hit
    assert record["scenarios"]["miss"]["hit_tiers"] == {"None": 3}
    assert "resolve_fresh" in capsys.readouterr().out
