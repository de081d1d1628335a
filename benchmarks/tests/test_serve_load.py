"""The serving benchmark's request mix and summary (no server)."""

from collections import Counter

from vlmcache_lab.serve_load import build_mix, idle_summary, summarize


def test_mix_has_every_kind_after_the_first_asks():
    mix = build_mix(300, pool=20)
    assert len(mix) == 300 and all(r.kind == "first" for r in mix[:20])
    kinds = Counter(r.kind for r in mix[20:])
    assert set(kinds) == {"repeat", "spacing", "paraphrase", "near_duplicate", "other_tenant"}
    assert {r.tenant for r in mix} == {"tenant-a", "tenant-b"}
    firsts = {(r.question, r.image_url) for r in mix[:20]}
    assert all((r.question, r.image_url) in firsts for r in mix if r.kind == "repeat")
    assert all(r.image_url.startswith("data:image/jpeg") for r in mix
               if r.kind == "near_duplicate")


def _row(tier, e2e, front, status=200):
    report = {"hit_tier": tier, "latency_s": e2e / 2000, "front_ms": front}
    return {"i": 0, "kind": "k", "tenant": "t", "status": status, "e2e_ms": e2e,
            "report": report if status == 200 else None, "answer": None}


def test_summary_counts_errors_tiers_and_stage_medians():
    rows = [_row(None, 100, {"decode": 1, "cascade": 3}), _row(None, 300, {"decode": 3,
                                                                          "cascade": 5}),
            _row("response", 4, {"decode": 1}), _row("text:exact", 50, {}),
            _row(None, 1, {}, status=500)]
    s = summarize(rows)
    assert s["requests"] == 5 and s["errors"] == 1
    assert s["hits_by_tier"] == {"miss": 2, "response": 1, "text:exact": 1}
    assert s["miss_overhead_ms_p50"] == {"cascade": 4.0, "decode": 2.0, "total": 6.0}
    assert s["response_hit_ms_p50"] == {"server": 2.0, "end_to_end": 4.0}
    idle = idle_summary(rows[2:3], rows[:2])
    assert idle["response_hit_ms_p50"]["end_to_end"] == 4.0
    assert idle["probes"]["errors"] == 0
