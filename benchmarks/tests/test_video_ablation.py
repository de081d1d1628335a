from vlmcache_lab.video_ablation import VARIANTS, summarize


def _row(e2e, front=None):
    return {"e2e_ms": e2e, "report": {"front_ms": front} if front else None}


def test_p50_skips_the_first_clip_and_front_sums_the_report():
    rows = {"miss": [_row(900), _row(100), _row(120), _row(110)],
            "followup": [_row(500), _row(60, {"decode": 1.0, "cascade": 0.5}),
                         _row(70, {"decode": 2.0}), _row(80, {"decode": 0.5})],
            "third": [_row(400), _row(50), _row(52), _row(54)]}
    out = summarize(rows)
    assert out == {"miss": 110, "followup": 70, "third": 52, "front_followup": 1.5}


def test_plain_and_the_ablations_are_named():
    assert VARIANTS["plain"] is None and VARIANTS["ours"] == {}
    assert VARIANTS["ours_no_kv_no_encoder"]["enable_encoder_cache"] is False
