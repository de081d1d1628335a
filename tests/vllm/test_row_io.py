"""Row jobs and the read-throughput meter (no vLLM)."""

import time

import numpy as np

from vlmcache.store.disk import DiskStore
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
