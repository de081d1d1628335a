"""The front's CPU share: which CPUs its threads use and at what priority."""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from vlmcache import cpu_share
from vlmcache.cpu_share import CpuShare, plan

linux_only = pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="Linux calls")


def test_plan_leaves_the_lowest_cpus_to_vllm():
    share = plan(4, 5, frozenset(range(16)))
    assert share.cpus == frozenset(range(4, 16)) and share.count == 12 and share.nice == 5
    # a cpuset of its own (taskset, a container): the share is taken from it
    assert plan(2, 0, frozenset({8, 9, 12, 13, 14})).cpus == frozenset({12, 13, 14})


def test_plan_does_not_partition_a_small_host_or_when_told_not_to():
    assert plan(4, 5, frozenset(range(5))).cpus is None  # one CPU left: not worth it
    assert plan(4, 5, frozenset(range(6))).cpus == frozenset({4, 5})
    assert plan(0, 5, frozenset(range(16))).cpus is None
    assert plan(4, 5, frozenset({0, 1})).count == 2  # every CPU this process has


def _thread_state(share: CpuShare) -> tuple[set[int], int, int]:
    before = cpu_share.current()
    cpu_share.configure(share)
    try:
        base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        with ThreadPoolExecutor(1, initializer=cpu_share.thread_initializer()) as pool:
            cpus, nice = pool.submit(lambda: (
                os.sched_getaffinity(0),
                os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))).result()
    finally:
        cpu_share.configure(before)
    return cpus, nice, base


@linux_only
def test_pool_threads_move_to_the_fronts_cpus_at_a_lower_priority():
    mine = os.sched_getaffinity(0)
    one = frozenset({max(mine)})
    cpus, nice, base = _thread_state(CpuShare(one, 3, 1))
    assert cpus == set(one) and nice == min(19, base + 3)
    # only the pool's thread moved: this one keeps its CPUs and priority
    assert os.sched_getaffinity(0) == mine
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base


@linux_only
def test_an_unpartitioned_share_leaves_threads_alone():
    cpus, nice, base = _thread_state(CpuShare(None, 0, 2))
    assert cpus == os.sched_getaffinity(0) and nice == base


@linux_only
def test_a_refused_call_is_a_warning_not_a_failure(caplog, monkeypatch):
    def refuse(*_args):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(os, "sched_setaffinity", refuse)
    monkeypatch.setattr(cpu_share, "_WARNED", set())
    cpu_share.pin_process(CpuShare(frozenset({0, 1}), 0, 2))
    cpu_share.pin_process(CpuShare(frozenset({0, 1}), 0, 2))
    assert [r.message for r in caplog.records].count(
        "vlmcache front: could not set its threads' CPU affinity ([Errno 22] Invalid "
        "argument); they run where the OS puts them") == 1


@linux_only
def test_a_plan_after_pinning_the_process_is_the_same_plan(monkeypatch):
    """A proxy worker pins itself, then its front plans its threads' share: from the CPUs
    the process had, not from the share it was pinned to (which would give away 4 more)."""
    calls = []
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)))
    monkeypatch.setattr(os, "sched_setaffinity", lambda pid, cpus: calls.append(set(cpus)))
    monkeypatch.setattr(cpu_share, "_BEFORE_PIN", None)
    share = plan(4, 5)
    cpu_share.pin_process(share)
    assert calls == [set(range(4, 16))]
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(4, 16)))  # pinned now
    assert plan(4, 5) == share
