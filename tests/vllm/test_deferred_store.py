"""Stores held one engine step: the call order vLLM's offloading connector uses per step
(``submit_*`` at the step's start, ``get_finished`` at its end)."""

import pytest
from vllm.v1.kv_offload.base import OffloadingWorker, TransferResult

from vlmcache.vllm.deferred_store import StoresAfterOutputs


class _Recorder(OffloadingWorker):
    """A worker that finishes every job at once and records the order it saw them in."""

    def __init__(self, refuse: bool = False) -> None:
        self.calls: list[tuple[str, int]] = []
        self.done: list[TransferResult] = []
        self.refuse = refuse

    def submit_store(self, job_id, src_spec, dst_spec):
        if self.refuse:
            return False
        self.calls.append(("store", job_id))
        self.done.append(TransferResult(job_id=job_id, success=True))
        return True

    def submit_load(self, job_id, src_spec, dst_spec):
        self.calls.append(("load", job_id))
        self.done.append(TransferResult(job_id=job_id, success=True))
        return True

    def get_finished(self):
        done, self.done = self.done, []
        return done

    def wait(self, job_ids):
        self.calls.append(("wait", min(job_ids)))

    def shutdown(self):
        self.calls.append(("shutdown", 0))


def _ids(results):
    return [r.job_id for r in results]


def test_a_store_goes_out_in_the_next_step_before_that_steps_loads():
    inner = _Recorder()
    worker = StoresAfterOutputs(inner)
    assert worker.submit_store(1, None, None)  # step 1 (vLLM: held from step 0)
    assert _ids(worker.get_finished()) == [] and inner.calls == []  # not in its own step
    worker.submit_load(2, None, None)  # step 2 begins
    assert inner.calls == [("store", 1), ("load", 2)]  # vLLM's order kept
    assert _ids(worker.get_finished()) == [1, 2]


def test_a_store_goes_out_in_an_idle_step_too():
    inner = _Recorder()
    worker = StoresAfterOutputs(inner)
    worker.submit_store(1, None, None)
    worker.get_finished()
    assert _ids(worker.get_finished()) == [1]  # the next step's end: submitted, then polled


def test_a_wait_submits_every_held_store_first():
    inner = _Recorder()
    worker = StoresAfterOutputs(inner)
    worker.submit_store(1, None, None)
    worker.get_finished()
    worker.submit_store(2, None, None)  # due: 1; held: 2
    assert inner.calls == [("store", 1)]
    worker.wait({2})  # a block of job 2 is about to be reused
    assert inner.calls == [("store", 1), ("store", 2), ("wait", 2)]
    worker.get_finished()
    worker.get_finished()
    assert inner.calls.count(("store", 2)) == 1  # never submitted twice


def test_shutdown_passes_held_stores_on_then_shuts_the_worker_down():
    inner = _Recorder()
    worker = StoresAfterOutputs(inner)
    worker.submit_store(1, None, None)
    worker.shutdown()
    assert inner.calls == [("store", 1), ("shutdown", 0)]


def test_a_refused_store_fails_loudly_not_silently_pending():
    worker = StoresAfterOutputs(_Recorder(refuse=True))
    worker.submit_store(7, None, None)
    worker.get_finished()
    with pytest.raises(RuntimeError, match="refused store job 7"):
        worker.get_finished()
