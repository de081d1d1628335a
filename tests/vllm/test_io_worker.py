"""The persistent tier's I/O process: a child that maps vLLM's CPU region by descriptor."""

from __future__ import annotations

import mmap
import os
import signal
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from vlmcache.config import VlmCacheConfig
from vlmcache.store.kvstore import open_persistent_kv_store
from vlmcache.vllm.cost import CostModel, CostPriors
from vlmcache.vllm.io_worker import ChildIO, make_executor
from vlmcache.vllm.persist import PersistentKV, TierGeometry
from vlmcache.vllm.row_io import JobOutcome, RowJob

ROWS, ROW = 16, 8192
NS = "c" * 64


class Region:
    """A file-backed region like vLLM's /dev/shm one: rows and an open descriptor."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_CREAT | os.O_RDWR, 0o600)
        os.ftruncate(self.fd, ROWS * ROW)
        self._map = mmap.mmap(self.fd, ROWS * ROW)
        self.rows = np.frombuffer(self._map, dtype=np.uint8).reshape(ROWS, ROW)


def _tier(tmp_path: Path, region: Region, config: VlmCacheConfig,
          probes: list | None = None) -> PersistentKV:
    cost = CostModel(CostPriors(1e12, 0.0, 1e3))
    store = open_persistent_kv_store(config)

    def on_probe(nbytes: int, seconds: float) -> None:
        if probes is not None:
            probes.append((nbytes, seconds))
        cost.observe_read(nbytes, seconds)

    return PersistentKV(store, TierGeometry(NS, 16, ROW), cost,
                        lambda done: make_executor(config, store, region.rows, region.fd,
                                                   done, on_probe))


def _wait_done(t: PersistentKV, n: int, timeout=60.0) -> list:
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        t.drain(timeout_s=1.0)
        out += t.finished()
    return out


def test_child_stores_then_a_new_child_loads_into_other_rows(tmp_path):
    config = VlmCacheConfig(store_path=str(tmp_path / "store"), kv_io_threads=2)
    src = Region(tmp_path / "region-a")
    src.rows[:] = np.random.default_rng(1).integers(0, 256, (ROWS, ROW), dtype=np.uint8)
    t = _tier(tmp_path, src, config)
    assert isinstance(t._io, ChildIO) and t._io.pid != os.getpid()
    t.submit_store(1, [b"k0", b"k1", b"k2"], [2, 3, 4], "r1", tenant="acme")
    assert [(o.job_id, o.success) for o in _wait_done(t, 1)] == [(1, True)]
    t.shutdown()

    dst = Region(tmp_path / "region-b")  # a restarted engine: new region, same store
    probes: list = []
    t2 = _tier(tmp_path, dst, config, probes)
    keys = [b"k0", b"k1", b"k2"]
    decision = t2.plan("r2", keys + [b"never-stored"])
    assert decision is not None and decision.choice == "load"
    assert all(t2.lookup(k, "r2") for k in keys)
    t2.submit_load(7, keys, [10, 11, 12], "r2")
    (outcome,) = _wait_done(t2, 1)
    assert (outcome.job_id, outcome.success, outcome.nbytes) == (7, True, 3 * ROW)
    assert np.array_equal(dst.rows[10:13], src.rows[2:5])
    report = t2.ledger.pop("r2")
    assert (report.chunks_found, report.chunks_loaded, report.chunks_failed) == (3, 3, 0)
    assert report.planned and report.to_params()["cost_model_choice"] == "load"
    t2.shutdown()
    assert probes and probes[0][0] >= 3 * ROW  # the child measured the store's reads


def test_a_killed_child_fails_pending_and_later_jobs_as_misses(tmp_path):
    config = VlmCacheConfig(store_path=str(tmp_path / "store"), kv_io_threads=2)
    region = Region(tmp_path / "region")
    outcomes: list[tuple[RowJob, JobOutcome]] = []
    got = threading.Event()

    def done(job: RowJob, outcome: JobOutcome) -> None:
        outcomes.append((job, outcome))
        got.set()

    io = make_executor(config, open_persistent_kv_store(config), region.rows, region.fd, done)
    assert isinstance(io, ChildIO)
    os.kill(io.pid, 9)
    io.submit(RowJob(5, "load", ("ab" * 32,), (0,)))
    assert got.wait(30)
    assert [(j.job_id, o.success) for j, o in outcomes] == [(5, False)]
    assert io.dead  # the persistent tier then promises nothing (test_persist)
    io.close()


def test_plan_skips_the_whole_prefix_when_recompute_is_cheaper(tmp_path):
    config = VlmCacheConfig(store_path=str(tmp_path / "store"), disk_write="sync")
    region = Region(tmp_path / "region")
    store = open_persistent_kv_store(config)
    cheap = CostModel(CostPriors(1.0, 0.0, 1e12))  # reads crawl, recompute is free
    t = PersistentKV(store, TierGeometry(NS, 16, ROW), CostModel(CostPriors(1e12, 0.0, 1e3)),
                     lambda done: make_executor(config, store, region.rows, None, done))
    t.submit_store(1, [b"k0", b"k1"], [0, 1])
    skip = PersistentKV(store, TierGeometry(NS, 16, ROW), cheap,
                        lambda done: make_executor(config, store, region.rows, None, done))
    decision = skip.plan("r", [b"k0", b"k1"])
    assert decision is not None and decision.choice == "skip"
    assert decision.tokens == 32 and decision.nbytes == 2 * ROW  # the prefix, not one row
    assert not skip.lookup(b"k0", "r")
    # nothing stored, and loading would lose: a skip the report shows (the tier never
    # writes such rows, a restart must still say why nothing was loaded)
    nothing = skip.plan("r2", [b"nothing", b"nothing2"])
    assert nothing is not None and nothing.choice == "skip" and nothing.tokens == 32
    assert not skip.lookup(b"nothing", "r2")
    assert skip.ledger.pop("r2").to_params()["cost_model_choice"] == "skip"


@pytest.mark.parametrize("bad", ['{"job": 1, "kind": "delete", "keys": [], "rows": []}',
                                 '{"job": 1, "kind": "load", "keys": ["a"], "rows": []}'])
def test_malformed_jobs_are_refused(bad):
    with pytest.raises(ValueError):
        RowJob.from_json(bad)


def test_a_planned_request_with_nothing_stored_misses_without_a_decision(tmp_path):
    config = VlmCacheConfig(store_path=str(tmp_path / "store"), disk_write="sync")
    region = Region(tmp_path / "region")
    store = open_persistent_kv_store(config)
    t = PersistentKV(store, TierGeometry(NS, 16, ROW), CostModel(CostPriors(1e12, 0.0, 1e3)),
                     lambda done: make_executor(config, store, region.rows, None, done))
    assert t.plan("r", [b"k0", b"k1"]) is None
    assert not t.lookup(b"k0", "r")
    report = t.ledger.pop("r")
    assert report.planned and report.decision is None
    assert "cost_model_choice" not in report.to_params()


def test_a_wedged_child_never_blocks_the_scheduler(tmp_path):
    config = VlmCacheConfig(store_path=str(tmp_path / "store"), kv_io_threads=1)
    region = Region(tmp_path / "region")
    failed: list[int] = []
    io = make_executor(config, open_persistent_kv_store(config), region.rows, region.fd,
                       lambda job, outcome: None if outcome.success else failed.append(job.job_id))
    assert isinstance(io, ChildIO)
    os.kill(io.pid, signal.SIGSTOP)  # a child stuck on a dead disk: its pipe fills up
    try:
        start = time.monotonic()
        for job in range(3000):  # ~300 kB of job lines: far more than a pipe holds
            io.submit(RowJob(job, "load", ("ab" * 32,) * 2, (0, 1)))
        assert time.monotonic() - start < 5.0
    finally:
        os.kill(io.pid, signal.SIGKILL)
    deadline = time.monotonic() + 30
    while len(failed) < 3000 and time.monotonic() < deadline:
        time.sleep(0.1)
    assert len(failed) == 3000  # every job of the dead child is a miss
    io.close()


ENGINE = """
import mmap, os, sys, threading, time
import numpy as np
from vlmcache.config import VlmCacheConfig
from vlmcache.store.kvstore import open_persistent_kv_store
from vlmcache.vllm.io_worker import make_executor
from vlmcache.vllm.row_io import RowJob
store, region, n, row = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
config = VlmCacheConfig(store_path=store, kv_io_threads=2)
fd = os.open(region, os.O_CREAT | os.O_RDWR, 0o600)
os.ftruncate(fd, n * row)
rows = np.frombuffer(mmap.mmap(fd, n * row), dtype=np.uint8).reshape(n, row)
rows[:] = np.random.default_rng(0).integers(0, 256, rows.shape, dtype=np.uint8)
staged = threading.Event()
io = make_executor(config, open_persistent_kv_store(config), rows, fd,
                   lambda job, outcome: staged.set())
io.submit(RowJob(1, "store", tuple(f"{i + 1:064x}" for i in range(n)), tuple(range(n))))
staged.wait(60)  # the rows are out of the region, written behind
print("staged", flush=True)
time.sleep(600)
"""


def test_rows_staged_when_the_engine_tree_is_killed_are_still_written(tmp_path):
    import subprocess
    import sys

    import psutil

    n, row = 64, 1 << 20
    store = tmp_path / "store"
    engine = subprocess.Popen([sys.executable, "-c", ENGINE, str(store), str(tmp_path / "r"),
                               str(n), str(row)], stdout=subprocess.PIPE, text=True)
    try:
        assert engine.stdout.readline().startswith("staged")
        # what vLLM's shutdown does to an engine after its grace period: SIGKILL the tree
        for child in psutil.Process(engine.pid).children(recursive=True):
            os.kill(child.pid, signal.SIGKILL)
    finally:
        engine.kill()
        engine.wait()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        written = list((store / "kv" / "chunks").rglob("*.safetensors"))
        if len(written) == n:
            break
        time.sleep(0.2)
    assert len(written) == n


class _HeldStore:
    """A chunk store whose row writes wait until the test lets them go."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.release = threading.Event()

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def put_row(self, key, name, row, *, tenant=None):
        self.release.wait(30)
        return self.inner.put_row(key, name, row, tenant=tenant)


def test_staged_rows_never_exceed_the_memory_budget(tmp_path):
    """Issue 33 item 4: staging was bounded by ``disk_write_queue`` alone (1 GiB by
    default): 78 MiB were staged under an 8 MiB ``memory_budget``. A queue above the budget
    is now a ConfigError, and the default queue follows the budget: two rows of budget
    here, so a job of eight rows cannot finish while the disk holds its writes."""
    config = VlmCacheConfig(store_path=str(tmp_path / "store"), kv_io_threads=2,
                            memory_budget=2 * ROW)
    region = Region(tmp_path / "region")
    store = _HeldStore(open_persistent_kv_store(config))
    finished = threading.Event()
    io = make_executor(config, store, region.rows, None,
                       lambda job, outcome: finished.set())
    keys = tuple(f"{i:02x}" * 32 for i in range(8))
    io.submit(RowJob(1, "store", keys, tuple(range(8))))
    assert not finished.wait(1.5)  # 2 rows staged, the third waits for the disk
    store.release.set()
    assert finished.wait(30)
    io.close()
    assert all(store.inner.contains(key) for key in keys)
