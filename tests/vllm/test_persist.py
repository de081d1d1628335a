"""The persistent KV tier's logic on a real DiskStore (no vLLM)."""

from pathlib import Path

import numpy as np
import pytest

from vlmcache.keys import kv_row_key
from vlmcache.store.disk import DiskStore
from vlmcache.vllm.cost import CostModel, CostPriors
from vlmcache.vllm.io_worker import InlineIO, ThreadIO
from vlmcache.vllm.persist import PersistentKV, TierGeometry
from vlmcache.vllm.row_io import RowMover

ROW = 4096
NS = "a" * 64


def rows(n=8, seed=0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, ROW), dtype=np.uint8)


def tier(root: Path, region: np.ndarray, ns=NS, sync=True, prefill=1e9, read=1e12):
    cost = CostModel(CostPriors(read, 0.0, prefill))
    store = DiskStore(root, 10**9)

    def make_io(done):
        mover = RowMover(store, region, threads=2)
        return InlineIO(mover, done) if sync else ThreadIO(mover, done, 2)

    return PersistentKV(store, TierGeometry(ns, 16, int(region.shape[1])), cost, make_io)


def test_rows_stored_then_loaded_by_a_new_tier_into_other_rows(tmp_path):
    src = rows()
    t = tier(tmp_path, src)
    t.submit_store(1, [b"k0", b"k1"], [3, 5], "r1")
    assert [(o.job_id, o.success) for o in t.finished()] == [(1, True)]
    t.shutdown()

    dst = np.zeros_like(src)  # a restarted engine: new region, same store
    t2 = tier(tmp_path, dst)
    assert t2.lookup(b"k0", "r2") and t2.lookup(b"k1", "r2")
    t2.submit_load(7, [b"k0", b"k1"], [0, 1], "r2")
    out = t2.finished()
    assert [(o.job_id, o.success, o.nbytes) for o in out] == [(7, True, 2 * ROW)]
    assert np.array_equal(dst[0], src[3]) and np.array_equal(dst[1], src[5])
    report = t2.ledger.pop("r2")
    assert report.chunks_found == 2 and report.chunks_loaded == 2
    assert report.to_params()["cost_model_choice"] == "load"


def test_another_namespace_never_finds_the_rows(tmp_path):
    src = rows()
    t = tier(tmp_path, src)
    t.submit_store(1, [b"k0"], [0])
    other = tier(tmp_path, np.zeros_like(src), ns="b" * 64)
    assert t.lookup(b"k0", "r")
    assert not other.lookup(b"k0", "r")
    assert kv_row_key(NS, b"k0") != kv_row_key("b" * 64, b"k0")


def test_a_corrupt_chunk_fails_its_load_job_and_is_reported(tmp_path):
    src = rows()
    t = tier(tmp_path, src)
    t.submit_store(1, [b"k0"], [0])
    t.finished()
    path = next((tmp_path / "chunks").rglob(kv_row_key(NS, b"k0") + "*"))
    data = bytearray(path.read_bytes())
    data[-10] ^= 0xFF
    path.write_bytes(bytes(data))
    dst = np.zeros_like(src)
    t.submit_load(2, [b"k0"], [0], "r")
    (outcome,) = t.finished()
    assert not outcome.success
    assert not dst[0].any()
    assert t.ledger.pop("r").chunks_failed == 1


def test_a_corrupt_chunk_mid_prompt_keeps_the_prefix_before_it(tmp_path):
    src = rows()
    t = tier(tmp_path, src)
    t.submit_store(1, [b"k0", b"k1", b"k2"], [0, 1, 2])
    path = next((tmp_path / "chunks").rglob(kv_row_key(NS, b"k1") + "*"))
    path.write_bytes(path.read_bytes()[:100])  # truncated
    dst = np.zeros_like(src)
    t2 = tier(tmp_path, dst)
    t2.submit_load(2, [b"k0", b"k1", b"k2"], [4, 5, 6], "r")
    (outcome,) = t2.finished()
    assert not outcome.success and outcome.loaded_keys == (b"k0",)
    assert np.array_equal(dst[4], src[0]) and not dst[5].any()
    report = t2.ledger.pop("r")
    assert (report.chunks_loaded, report.chunks_failed) == (1, 2)  # k1 faulty, k2 after it
    assert not t2.lookup(b"k1", "r2")  # the faulty file is gone: a miss from now on


def test_a_row_of_another_size_is_never_loaded(tmp_path):
    t = tier(tmp_path, rows())
    t.submit_store(1, [b"k0"], [0])
    small = np.zeros((4, ROW // 2), dtype=np.uint8)  # another KV layout, same namespace
    t2 = tier(tmp_path, small)
    t2.submit_load(2, [b"k0"], [0], "r")
    (outcome,) = t2.finished()
    assert not outcome.success and not small.any()


def test_cost_model_skip_is_a_miss_with_its_reason(tmp_path):
    src = rows()
    t = tier(tmp_path, src)
    t.submit_store(1, [b"k0"], [0])
    slow = tier(tmp_path, src, prefill=1e12, read=1.0)  # recompute is ~free, reads crawl
    assert not slow.lookup(b"k0", "r")
    params = slow.ledger.pop("r").to_params()
    assert params["cost_model_choice"] == "skip"
    assert params["persistent_chunks_found"] == 0  # not even looked for
    assert "recompute" in params["cost_model_reason"]


def test_async_jobs_finish_on_io_threads_and_drain(tmp_path):
    src = rows(32)
    t = tier(tmp_path, src, sync=False)
    for job in range(8):
        t.submit_store(job, [f"k{job}".encode()], [job])
    t.drain()
    stored = t.finished()
    assert sorted(o.job_id for o in stored) == list(range(8))
    assert all(o.success for o in stored)
    t.submit_load(100, [b"k3"], [20], "r")
    t.drain()
    done = {o.job_id: o.success for o in t.finished()}
    assert done.get(100) is True
    assert np.array_equal(src[20], src[3])
    t.shutdown()


def test_rows_must_be_bytes():
    with pytest.raises(ValueError):
        RowMover(None, np.zeros((2, 2), dtype=np.float32))  # type: ignore[arg-type]


def test_rows_the_cost_model_would_never_load_are_not_written(tmp_path):
    t = tier(tmp_path, rows(), prefill=1e12, read=1.0)  # loading can never win
    t.submit_store(1, [b"k0"], [0], "r1")
    assert [o.success for o in t.finished()] == [True]
    assert not list((tmp_path / "chunks").rglob("*.safetensors"))
    assert not tier(tmp_path, rows()).lookup(b"k0", "r")
    params = t.ledger.pop("r1").to_params()  # the capturing request's report says why
    assert params["cost_model_choice"] == "skip" and "recompute" in params["cost_model_reason"]


def test_writes_pay_only_where_a_load_would_beat_recompute(tmp_path):
    region = rows()
    assert tier(tmp_path / "fast", region).writes_pay(41)
    # 4 KiB rows at 1 KB/s against a 1e9 tokens/s prefill: a load never wins
    assert not tier(tmp_path / "slow", region, read=1e3).writes_pay(41)


class _CountingIndex:
    """A store index that counts the scheduler's questions."""

    def __init__(self, inner: DiskStore) -> None:
        self.inner, self.asked = inner, 0

    def contains(self, key: str) -> bool:
        self.asked += 1
        return self.inner.contains(key)


def _counted_tier(root: Path, region: np.ndarray) -> tuple[PersistentKV, _CountingIndex]:
    store = DiskStore(root, 10**9)
    index = _CountingIndex(store)
    t = PersistentKV(index, TierGeometry(NS, 16, int(region.shape[1])),
                     CostModel(CostPriors(1e12, 0.0, 1e9)),
                     lambda done: InlineIO(RowMover(store, region, threads=1), done))
    return t, index


def test_expected_chunks_ask_the_store_nothing_until_vllm_looks_one_up(tmp_path):
    src = rows()
    writer = tier(tmp_path, src)
    writer.submit_store(1, [b"k0", b"k1", b"k2"], [0, 1, 2])
    t, index = _counted_tier(tmp_path, np.zeros_like(src))
    # a CPU-tier hit: vLLM's CPU tier serves every chunk, this tier is never asked
    t.expect("cpu-hit", [b"k0", b"k1", b"k2", b"k3"])
    assert index.asked == 0
    report = t.ledger.pop("cpu-hit")
    assert not report.planned and "cost_model_choice" not in report.to_params()
    # vLLM's CPU tier lacks k1 onward: the plan covers the stored prefix from there
    t.expect("r", [b"k0", b"k1", b"k2", b"k3"])
    assert t.lookup(b"k1", "r") and t.lookup(b"k2", "r") and not t.lookup(b"k3", "r")
    report = t.ledger.pop("r")
    assert report.planned and report.decision is not None
    assert report.decision.tokens == 2 * 16 and report.decision.nbytes == 2 * ROW
    assert report.chunks_found == 2


def test_a_lookup_the_connector_did_not_expect_is_decided_alone(tmp_path):
    src = rows()
    writer = tier(tmp_path, src)
    writer.submit_store(1, [b"k0", b"other"], [0, 1])
    t, _ = _counted_tier(tmp_path, np.zeros_like(src))
    t.expect("r", [b"k0"])
    assert t.lookup(b"other", "r")  # not among the expected keys: this chunk alone
    report = t.ledger.pop("r")
    assert not report.planned and report.decision.tokens == 16


def _split_tier(root: Path, region: np.ndarray) -> PersistentKV:
    """The scheduler's index and the I/O process's store are two opens of one root, as with
    vLLM's default process layout (the I/O process runs beside the EngineCore)."""
    cost = CostModel(CostPriors(1e12, 0.0, 1e9))
    index, io_store = DiskStore(root, 10**9), DiskStore(root, 10**9)

    def make_io(done):
        return InlineIO(RowMover(io_store, region, threads=2), done)

    return PersistentKV(index, TierGeometry(NS, 16, int(region.shape[1])), cost, make_io)


def test_a_chunk_a_load_found_damaged_is_never_promised_again(tmp_path):
    """Issue 33 (chaos run): the I/O process removed a damaged chunk, but the scheduler's
    index, opened before, still listed it: vLLM was promised it again and again (a
    load-fail-lookup loop of 350k jobs while the requests waited)."""
    src = rows()
    writer = tier(tmp_path, src)
    writer.submit_store(1, [b"k0", b"k1"], [0, 1])
    writer.shutdown()
    t = _split_tier(tmp_path, np.zeros_like(src))
    path = next((tmp_path / "chunks").rglob(kv_row_key(NS, b"k1") + "*"))
    path.write_bytes(path.read_bytes()[:100])  # damaged under the running engine
    assert t.lookup(b"k1", "r1")  # the scheduler cannot know yet
    t.submit_load(2, [b"k0", b"k1"], [0, 1], "r1")
    (outcome,) = t.finished()
    assert not outcome.success and outcome.loaded_keys == (b"k0",)
    assert t.lookup(b"k0", "r2") and not t.lookup(b"k1", "r2")  # k0 still good
    t.submit_store(3, [b"k1"], [1])  # recomputed and captured again: promised again
    t.finished()
    assert t.lookup(b"k1", "r3")


def test_a_dead_io_process_is_promised_nothing(tmp_path):
    t = tier(tmp_path, rows())
    t.submit_store(1, [b"k0"], [0])
    t.finished()
    assert t.lookup(b"k0", "r1")
    t._io.dead = True  # what ChildIO says once its process has ended
    assert not t.lookup(b"k0", "r2")
