"""The GPU benchmark's process handling (no GPU)."""

import subprocess
import sys
import time

import pytest

from vlmcache_lab import mode_procs


def test_a_terminated_run_kills_the_running_modes_process_group():
    proc = subprocess.Popen(["sleep", "60"], start_new_session=True)
    mode_procs._RUNNING.append(proc)
    try:
        with pytest.raises(SystemExit):
            mode_procs.kill_running(15, None)
        assert proc.wait(timeout=10) == -9
    finally:
        mode_procs._RUNNING.remove(proc)
        proc.kill()


def test_a_finished_mode_waits_for_its_detached_io_process_then_kills_it():
    # an I/O process that left the mode's process tree (argv names it like the real one)
    io = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                           "vlmcache.vllm.io_worker"], start_new_session=True)
    mode = subprocess.Popen(["true"], start_new_session=True)
    mode.wait()
    try:
        assert io.pid in mode_procs._io_processes()
        mode_procs._end_group(mode, flush_s=1.0)
        assert io.wait(timeout=10) == -9
        assert io.pid not in mode_procs._io_processes()
    finally:
        io.kill()


_FAKE_MODE = """
import json, sys, time
from vlmcache_lab.turns import Turns
a = sys.argv[1:]
mode, out = a[a.index("--child") + 1], a[a.index("--child-out") + 1]
turns = Turns(a[a.index("--turns") + 1], mode, ["miss"])
share = float(a[a.index("--gpu-memory-utilization") + 1])
turns.phase("miss")
spans = []
for _ in range(5):
    with turns.turn():
        t0 = time.time(); time.sleep(0.01); spans.append((t0, time.time()))
turns.close()
json.dump({"spans": spans, "share": share}, open(out, "w"))
"""


def test_a_group_runs_its_modes_at_once_taking_turns(tmp_path, monkeypatch):
    import argparse

    monkeypatch.setattr(mode_procs, "CHILD_CMD", (sys.executable, "-c", _FAKE_MODE))
    args = argparse.Namespace(work=str(tmp_path), mode_timeout=60, flush_timeout=0.0,
                              gpu_memory_utilization=0.9, pin_cpus=False)
    results = mode_procs.run_group(["vllm", "vlmcache"], args, [])
    assert set(results) == {"vllm", "vlmcache"}
    spans = sorted((s[0], s[1], m) for m, r in results.items() for s in r["spans"])
    assert len(spans) == 10
    assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))  # never at once
    assert len({m for _, _, m in spans[:4]}) == 2  # interleaved, not one after the other
    for r in results.values():
        assert r["share"] == 0.45 and r["interleaved_with"] == ["vllm", "vlmcache"]


def test_a_mode_alone_gets_no_turn_server(tmp_path, monkeypatch):
    import argparse

    script = ("import json, sys; a = sys.argv[1:]; print('engine says hi'); "
              "json.dump({'argv': a}, open(a[a.index('--child-out') + 1], 'w'))")
    monkeypatch.setattr(mode_procs, "CHILD_CMD", (sys.executable, "-c", script))
    args = argparse.Namespace(work=str(tmp_path), mode_timeout=60, flush_timeout=0.0,
                              gpu_memory_utilization=0.9, pin_cpus=False)
    result = mode_procs.run_group(["vllm"], args, ["--n", "3"])["vllm"]
    assert "--turns" not in result["argv"] and "interleaved_with" not in result
    assert result["argv"][-2:] == ["--n", "3"]
    assert (tmp_path / "vllm.log").read_text() == "engine says hi\n"  # kept for diagnosis


def test_a_mode_that_dies_at_start_up_holds_the_other_back_no_longer(tmp_path, monkeypatch):
    import argparse

    script = ("import sys\n"
              "if '--child' in sys.argv and sys.argv[sys.argv.index('--child') + 1] == 'vllm':\n"
              "    sys.exit(3)  # before its hello, as an engine that fails to start\n" + _FAKE_MODE)
    monkeypatch.setattr(mode_procs, "CHILD_CMD", (sys.executable, "-c", script))
    args = argparse.Namespace(work=str(tmp_path), mode_timeout=60, flush_timeout=0.0,
                              gpu_memory_utilization=0.9, pin_cpus=False)
    start = time.monotonic()
    results = mode_procs.run_group(["vllm", "vlmcache"], args, [])
    assert time.monotonic() - start < 30
    assert results["vllm"]["error"] == "exit 3"
    assert len(results["vlmcache"]["spans"]) == 5


def test_pinned_modes_run_on_disjoint_cores(tmp_path, monkeypatch):
    import argparse
    import os

    script = ("import json, os, sys; a = sys.argv[1:]; "
              "json.dump({'cpus': sorted(os.sched_getaffinity(0))}, "
              "open(a[a.index('--child-out') + 1], 'w'))")
    monkeypatch.setattr(mode_procs, "CHILD_CMD", (sys.executable, "-c", script))
    args = argparse.Namespace(work=str(tmp_path), mode_timeout=60, flush_timeout=0.0,
                              gpu_memory_utilization=0.9, pin_cpus=True)
    results = mode_procs.run_group(["vllm", "vlmcache"], args, [])
    ours, theirs = set(results["vlmcache"]["cpus"]), set(results["vllm"]["cpus"])
    assert ours and theirs and not ours & theirs
    assert ours | theirs <= os.sched_getaffinity(0)
    assert mode_procs.cpu_slices(len(os.sched_getaffinity(0)) + 1) == [None] * (
        len(os.sched_getaffinity(0)) + 1)  # too few cores: not pinned
