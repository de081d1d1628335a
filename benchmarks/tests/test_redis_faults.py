"""Redis fault kinds (few trials each): no exception escapes, no wrong bytes are served."""

from __future__ import annotations

from vlmcache_lab import redis_faults as rf


def _clean(res: rf.FaultResult) -> None:
    assert res.trials > 0
    assert res.exceptions == 0, res
    assert res.wrong_bytes_served == 0, res


def test_killed_and_restarted(live_redis):
    res = rf.kill_restart(live_redis, trials=2)
    _clean(res)
    assert 0 < res.acknowledged == res.acknowledged_lost  # no persistence: all lost...
    assert res.unlogged_losses == 0  # ...as misses, each outage logged
    assert "0 trial(s)" in res.method  # writes and reads resumed after every restart


def test_hung_redis_misses_within_bound(live_redis):
    res = rf.hung(live_redis, trials=20)
    _clean(res)
    assert res.misses >= 20 and res.max_lookup_ms < 50
    back = int(res.method.split("; ")[-1].split("/")[0])
    assert back > 0  # reads work again after SIGCONT (5 ms timeouts: some may miss on a busy VM)


def test_corrupt_values_are_misses(live_redis):
    res = rf.corrupt(live_redis, trials=8)
    _clean(res)
    assert res.misses == 8 and res.unlogged_losses == 0


def test_four_processes_one_budget(live_redis, tmp_path):
    res = rf.four_processes(live_redis, ops=150, workdir=tmp_path)
    _clean(res)
    assert res.trials == 600 and res.acknowledged > 0
    assert res.over_budget_bytes == 0 and res.accounting_mismatch_bytes == 0


def test_writer_killed_mid_write(live_redis, tmp_path):
    res = rf.kill_writer(live_redis, trials=1, workdir=tmp_path)
    _clean(res)
    assert res.acknowledged > 0 and res.acknowledged_lost == 0  # acked before the kill
    assert res.accounting_mismatch_bytes == 0


def test_lookup_times_are_summarized_not_dumped():
    res = rf.RedisFaultResult("x", lookups_ms=[float(i) for i in range(1, 101)])
    out = res.as_json()
    assert "lookups_ms" not in out and out["lookups_timed"] == 100
    assert out["p99_lookup_ms"] == 99.0
