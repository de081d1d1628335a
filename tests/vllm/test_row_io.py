"""Row jobs and the read-throughput meter (no vLLM)."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np

from vlmcache.store.disk import DiskStore
from vlmcache.store.journal import orphaned_count
from vlmcache.vllm.row_io import ReadMeter, RowJob, RowMover


def test_overlapping_loads_are_one_busy_period_not_queue_time():
    reports: list[tuple[int, float]] = []
    meter = ReadMeter(lambda n, s: reports.append((n, s)))
    meter.begin()
    meter.begin()  # a second request's load while the first runs
    time.sleep(0.02)
    meter.end(100)
    assert reports == []  # still busy
    meter.end(300)
    assert len(reports) == 1 and reports[0][0] == 400 and 0.02 <= reports[0][1] < 1.0


def test_a_batch_of_jobs_loads_in_parallel_and_reports_its_throughput(tmp_path):
    rng = np.random.default_rng(0)
    src = rng.integers(0, 256, (32, 65536), dtype=np.uint8)
    reads: list[tuple[int, float]] = []
    store = DiskStore(tmp_path, 10**9)
    mover = RowMover(store, src, threads=4, on_read=lambda n, s: reads.append((n, s)))
    keys = tuple(f"{i:064x}" for i in range(16))
    assert mover.run(RowJob(1, "store", keys, tuple(range(16)))).success
    dst = np.zeros_like(src)
    reader = RowMover(store, dst, threads=4, on_read=lambda n, s: reads.append((n, s)))
    out = reader.run(RowJob(2, "load", keys, tuple(range(16, 32))))
    assert out.success and out.loaded == 16 and out.nbytes == 16 * 65536
    assert np.array_equal(dst[16:], src[:16])
    assert reads and reads[-1][0] == 16 * 65536


def test_a_job_naming_a_row_outside_the_region_fails_cleanly(tmp_path):
    mover = RowMover(DiskStore(tmp_path, 10**9), np.zeros((4, 16), dtype=np.uint8))
    out = mover.run(RowJob(3, "load", ("ab" * 32,), (99,)))
    assert not out.success and out.loaded == 0


def test_second_sight_admission_writes_a_row_only_when_offered_again(tmp_path):
    from vlmcache.store.policy import GhostFilter

    store = DiskStore(tmp_path, 10**9)
    src = np.arange(4 * 16, dtype=np.uint8).reshape(4, 16)
    mover = RowMover(store, src, threads=2, admission=GhostFilter(64))
    keys = ("ab" * 32, "cd" * 32)
    first = mover.run(RowJob(1, "store", keys, (0, 1)))
    assert first.success and first.nbytes == 0 and not store.contains(keys[0])
    again = mover.run(RowJob(2, "store", keys, (0, 1)))
    assert again.nbytes == 32 and store.contains(keys[0]) and store.contains(keys[1])
    assert mover.not_admitted == 2


class _SlowStore(DiskStore):
    """A disk store whose writes wait until the test lets them go."""

    def __init__(self, root, budget):
        super().__init__(root, budget)
        import threading

        self.release = threading.Event()

    def put_row(self, key, name, row, *, tenant=None):
        self.release.wait(10)
        return super().put_row(key, name, row, tenant=tenant)


def test_a_staged_store_job_finishes_before_its_rows_are_written_and_keeps_their_bytes(
        tmp_path):
    store = _SlowStore(tmp_path, 10**9)
    rows = np.arange(4 * 64, dtype=np.uint8).reshape(4, 64)
    expected = rows[:2].copy()
    mover = RowMover(store, rows, threads=2, staging_bytes=1024)
    keys = ("ab" * 32, "cd" * 32)
    out = mover.run(RowJob(1, "store", keys, (0, 1)))
    assert out.success and out.nbytes == 128
    assert not store.contains(keys[0])  # finished, not yet written
    rows[:] = 0  # vLLM reuses the rows at once: the staged copies must not change
    store.release.set()
    mover.close()
    reopened = DiskStore(tmp_path, 10**9)
    for key, want in zip(keys, expected):
        assert np.array_equal(reopened.get(key)["kv"].numpy(), want)


def test_rows_past_the_staging_budget_are_written_before_the_job_finishes(tmp_path):
    store = _SlowStore(tmp_path, 10**9)
    store.release.set()
    rows = np.ones((4, 64), dtype=np.uint8)
    mover = RowMover(store, rows, threads=1, staging_bytes=10)  # smaller than one row
    key = "ef" * 32
    assert mover.run(RowJob(1, "store", (key,), (0,))).success
    assert store.contains(key)  # written in the job, nothing dropped
    mover.close()


_KV_WRITER = textwrap.dedent("""
    import sys, time
    import numpy as np
    from vlmcache.store.disk import DiskStore
    from vlmcache.vllm.row_io import RowJob, RowMover

    class Stuck(DiskStore):  # a disk that never finishes a write
        def put_row(self, key, name, row, *, tenant=None):
            time.sleep(3600)

    root = sys.argv[1]
    rows = np.ones((16, 64), dtype=np.uint8)
    mover = RowMover(Stuck(root, 10**9), rows, threads=2, staging_bytes=12 * 64,
                     journal_dir=__import__("pathlib").Path(root) / "journal")
    keys = tuple(f"{i:064x}" for i in range(10))
    out = mover.run(RowJob(1, "store", keys, tuple(range(10))))
    print("ok" if out.success else "failed", flush=True)
    time.sleep(3600)
""")


def test_rows_staged_by_a_killed_io_process_are_reported_at_the_next_start(tmp_path, caplog):
    """Issue 33 item 7: a killed KV I/O process logged its 16 pending jobs, not the ~250
    staged rows its finished store jobs had acknowledged; the next start said nothing."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, "-c", _KV_WRITER, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout is not None
    assert child.stdout.readline().strip() == "ok"  # the job acknowledged its 10 rows
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    assert orphaned_count(tmp_path / "journal") == 10  # what the engine's log now says
    with caplog.at_level("WARNING", logger="vlmcache.store.journal"):
        mover = RowMover(DiskStore(tmp_path, 10**9), np.ones((16, 64), dtype=np.uint8),
                         staging_bytes=1024, journal_dir=tmp_path / "journal")
    assert mover.lost_in_crash == 10
    assert "10 acknowledged chunk writes" in caplog.text
    mover.close()
