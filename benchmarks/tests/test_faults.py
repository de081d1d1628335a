"""The fault suite (issue 14): every fault kind of the local stores, a few trials each.

Each must end with no exception escaping, no wrong bytes served, and every loss a miss with
a log line. The same trials, with more of them, write benchmarks/results/reliability.json.
"""

from __future__ import annotations

import pytest

from vlmcache_lab import fault_inputs, fault_procs, faults
from vlmcache_lab.faults import FaultResult


def assert_clean(res: FaultResult, may_lose: bool = False) -> None:
    assert res.trials > 0
    assert res.exceptions == 0, res
    assert res.wrong_bytes_served == 0, res
    assert res.unlogged_losses == 0, res
    assert res.over_budget_bytes == 0, res
    if not may_lose:
        assert res.acknowledged_lost == 0, res


@pytest.mark.parametrize("trial", [faults.corrupt_chunk, faults.truncated_chunk])
def test_damaged_chunks_are_logged_misses(trial) -> None:
    res = trial(8)
    assert_clean(res)
    assert res.misses >= 8  # the damaged chunk, in the live store and after a reopen


def test_damaged_manifests_lose_nothing() -> None:
    assert_clean(faults.corrupt_manifest(6))  # one trial per kind of damage


def test_disk_full() -> None:
    assert_clean(faults.disk_full(3))


def test_kill9_during_sync_writes_loses_no_acknowledged_chunk() -> None:
    res = fault_procs.kill9_writes(1, "sync")
    assert_clean(res)
    assert res.acknowledged > 0


def test_kill9_during_async_writes_loses_only_the_queue() -> None:
    res = fault_procs.kill9_writes(1, "async")
    assert_clean(res, may_lose=True)  # what was queued is lost: a miss, never wrong bytes
    assert res.acknowledged_lost == res.misses <= res.acknowledged


def test_four_processes_on_one_store() -> None:
    assert_clean(fault_procs.four_processes(1))


def test_hostile_names() -> None:
    assert_clean(fault_inputs.hostile_names(1))


def test_lone_surrogate_tenant() -> None:
    assert_clean(fault_inputs.lone_surrogate_tenant(1))


def test_planted_symlinks() -> None:
    assert_clean(fault_inputs.planted_symlinks(3))
