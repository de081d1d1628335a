"""The GPU benchmark's process handling (no GPU)."""

import subprocess
import sys

import pytest

from vlmcache.bench import mode_procs


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
