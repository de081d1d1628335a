"""A lookup waits for the records of answers already sent, within ``record_wait_ms``."""

from __future__ import annotations

import json
import sys
import threading
import time
from pathlib import Path

from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).parent))
from fakes import chat, image  # noqa: E402

from vlmcache.config import VlmCacheConfig  # noqa: E402
from vlmcache.serving.front import CascadeFront  # noqa: E402
from vlmcache.serving.metrics import FrontMetrics  # noqa: E402


def _front(tmp_path: Path, wait_ms: float) -> CascadeFront:
    (tmp_path / "m").mkdir(exist_ok=True)
    metrics = FrontMetrics.create(CollectorRegistry())
    return CascadeFront.for_model(str(tmp_path / "m"), VlmCacheConfig(
        store_path=str(tmp_path / "s"), model_revision="t", record_wait_ms=wait_ms),
        metrics=metrics)


def _cut(front: CascadeFront) -> float:
    return front.metrics.record_waits_cut._value.get()


def test_a_stuck_record_costs_a_lookup_at_most_record_wait_ms(tmp_path):
    front = _front(tmp_path, wait_ms=30)
    release = threading.Event()
    front._recorder.submit(release.wait, 30)  # a record that does not finish
    try:
        t0 = time.perf_counter()
        plan = front.begin("chat", json.dumps(chat("What colour?", image(1))).encode(), {})
        took = time.perf_counter() - t0
        assert plan.forward is not None  # the lookup went on (a miss)
        assert 0.025 <= plan.stages["wait_records"] < 1.0 and took < 1.5
        assert _cut(front) == 1
    finally:
        release.set()
        front.close()


def test_records_that_finish_in_time_are_waited_for(tmp_path):
    front = _front(tmp_path, wait_ms=5_000)
    done = []
    front._recorder.submit(lambda: (time.sleep(0.05), done.append(1)))
    front.begin("chat", json.dumps(chat("What colour?", image(2))).encode(), {})
    assert done == [1] and _cut(front) == 0  # read your writes
    front.close()


def test_drain_says_whether_the_queue_emptied(tmp_path):
    front = _front(tmp_path, wait_ms=50)
    release = threading.Event()
    front._recorder.submit(release.wait, 30)
    assert front.drain(0.01) is False
    release.set()
    assert front.drain(5.0) is True and front.drain() is True
    front.close()


def test_the_fronts_threads_keep_their_priority_inside_vllms_process(tmp_path):
    from vlmcache import cpu_share

    before = cpu_share.current()
    (tmp_path / "m").mkdir(exist_ok=True)
    cfg = VlmCacheConfig(store_path=str(tmp_path / "s"), model_revision="t",
                         front_thread_nice=7)
    try:
        front = CascadeFront.for_model(str(tmp_path / "m"), cfg, metrics=None)
        assert cpu_share.current().nice == 0  # vlmcache serve: vLLM's API server
        front.close()
        front = CascadeFront.for_model(str(tmp_path / "m"), cfg, metrics=None,
                                       own_process=True)
        assert cpu_share.current().nice == 7  # a proxy process of its own
        front.close()
    finally:
        cpu_share.configure(before)
