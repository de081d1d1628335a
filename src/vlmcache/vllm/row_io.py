"""Moving offload rows between vLLM's CPU region and a chunk store (plain Python, no vLLM).

A :class:`RowJob` names store keys and rows of the region; :class:`RowMover` runs it on a
pool of threads, one chunk per task, so a request's prefix is read or written in parallel
(vLLM batches a request's promotions into one job). The mover runs in the persistent tier's
I/O process (:mod:`vlmcache.vllm.io_worker`), away from the engine's GIL, or, for
``disk_write: sync`` and tests, in the caller. Jobs and outcomes cross the process boundary
as JSON lines.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Literal, Protocol

import numpy as np
import torch

from vlmcache.store.base import Tensors
from vlmcache.store.policy import GhostFilter
from vlmcache.store.writeback import WriteBehind

logger = logging.getLogger(__name__)

TENSOR_NAME = "kv"
JobKind = Literal["store", "load"]


class RowStore(Protocol):
    """What the tier needs of a chunk store (``DiskStore`` and the Redis-backed store fit)."""

    def contains(self, key: str) -> bool: ...

    def get_into(self, key: str, name: str, out: memoryview) -> bool: ...

    def put_row(self, key: str, name: str, row: memoryview, *,
                tenant: str | None = None) -> bool: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class RowJob:
    """Store rows ``rows`` under store keys ``keys``, or load ``keys`` into ``rows``."""

    job_id: int
    kind: JobKind
    keys: tuple[str, ...]
    rows: tuple[int, ...]
    tenant: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ("store", "load"):
            raise ValueError(f"job kind must be 'store' or 'load', got {self.kind!r}")
        if len(self.keys) != len(self.rows):
            raise ValueError("a job needs one row per key")

    def to_json(self) -> str:
        return json.dumps({"job": self.job_id, "kind": self.kind, "keys": list(self.keys),
                           "rows": list(self.rows), "tenant": self.tenant})

    @classmethod
    def from_json(cls, line: str) -> "RowJob":
        d = json.loads(line)
        tenant = d.get("tenant")
        return cls(int(d["job"]), d["kind"], tuple(str(k) for k in d["keys"]),
                   tuple(int(r) for r in d["rows"]), None if tenant is None else str(tenant))


@dataclass(frozen=True)
class JobOutcome:
    """A finished job: for a load, ``loaded`` leading keys are in their rows."""

    job_id: int
    success: bool
    nbytes: int
    seconds: float
    loaded: int = 0

    def to_json(self) -> str:
        return json.dumps({"job": self.job_id, "ok": self.success, "nbytes": self.nbytes,
                           "seconds": self.seconds, "loaded": self.loaded})

    @classmethod
    def from_json(cls, line: str) -> "JobOutcome":
        d = json.loads(line)
        return cls(int(d["job"]), bool(d["ok"]), int(d["nbytes"]), float(d["seconds"]),
                   int(d["loaded"]))


class ReadMeter:
    """The store's read throughput as the cost model needs it: bytes loaded per second of
    time during which any load was running. (Timing each request's load end to end would
    charge it the queue behind concurrent loads: a batch of 32 looked 32x slower.)"""

    def __init__(self, report: Callable[[int, float], None] | None) -> None:
        self._report = report
        self._lock = threading.Lock()
        self._running = 0
        self._start = 0.0
        self._bytes = 0

    def begin(self) -> None:
        with self._lock:
            if self._running == 0:
                self._start, self._bytes = time.perf_counter(), 0
            self._running += 1

    def end(self, nbytes: int) -> None:
        with self._lock:
            self._running -= 1
            self._bytes += nbytes
            if self._running or not self._bytes or self._report is None:
                return
            busy = (self._bytes, time.perf_counter() - self._start)
        self._report(*busy)


class RowMover:
    """Runs :class:`RowJob` s between ``rows`` (a ``(n, row_bytes)`` uint8 view) and a store;
    ``on_read(bytes, seconds)`` gets the read throughput of each busy period; with
    ``admission`` a row is written only the second time it is offered.

    With ``staging_bytes`` > 0 a store job copies its rows out of the region and finishes
    (vLLM may then reuse the rows, and its engine can idle: while a store job is pending,
    vLLM's engine loop spins instead of waiting for requests); the copies are written
    behind, at most ``staging_bytes`` of them at a time. A row that does not fit is written
    before the job finishes, as with no staging. A staged row lost to a crash or a failed
    write is a later miss, never wrong bytes (chunk files are renamed into place whole);
    with ``journal_dir`` the next mover on that directory reports the rows a crash lost."""

    def __init__(self, store: RowStore, rows: np.ndarray, threads: int = 4,
                 on_read: Callable[[int, float], None] | None = None,
                 admission: GhostFilter | None = None, staging_bytes: int = 0,
                 journal_dir: Path | None = None) -> None:
        if rows.ndim != 2 or rows.dtype != np.uint8:
            raise ValueError("rows must be a 2-D uint8 array")
        self._store = store
        self._rows = rows
        self._pool = ThreadPoolExecutor(max(1, threads), "vlmcache-kv-row")
        self._meter = ReadMeter(on_read)
        self._admission = admission  # second sight: a row is written when offered again
        self._admission_lock = threading.Lock()
        self.not_admitted = 0
        # staged rows are journaled: the next start reports what a crash lost
        self._behind = (WriteBehind(_StagedRows(store), staging_bytes, max(1, threads // 2),
                                    journal_dir=journal_dir)
                        if staging_bytes > 0 else None)

    @property
    def lost_in_crash(self) -> int:
        """Staged rows a crashed mover on the same journal directory acknowledged and never
        wrote (found and reported when this one started)."""
        return self._behind.crash_loss.count if self._behind is not None else 0

    @property
    def row_bytes(self) -> int:
        return int(self._rows.shape[1])

    def run(self, job: RowJob) -> JobOutcome:
        """Run ``job``; a fault is a failed job (a miss), never an exception."""
        start = time.perf_counter()
        try:
            if any(not 0 <= r < self._rows.shape[0] for r in job.rows):
                raise ValueError(f"job {job.job_id}: a row outside the region")
            ok, nbytes, loaded = (self._store_all(job) if job.kind == "store"
                                  else self._load_all(job))
        except Exception:  # a cache fault is a failed job, never a crash
            logger.exception("vlmcache KV tier: job %d failed", job.job_id)
            ok, nbytes, loaded = False, 0, 0
        return JobOutcome(job.job_id, ok, nbytes, time.perf_counter() - start, loaded)

    def close(self) -> None:
        """Finish running jobs and staged writes, then close the store."""
        self._pool.shutdown(wait=True)
        if self._behind is not None:
            self._behind.close()
        self._store.close()
        self._rows = np.zeros((0, self.row_bytes), dtype=np.uint8)

    def _store_all(self, job: RowJob) -> tuple[bool, int, int]:
        written = list(self._pool.map(lambda kr: self._store_one(kr[0], kr[1], job.tenant),
                                      zip(job.keys, job.rows)))
        ok = all(n >= 0 for n in written)
        return ok, sum(max(n, 0) for n in written), 0

    def _store_one(self, key: str, row: int, tenant: str | None) -> int:
        """Bytes written (0: already stored; -1: the store refused or failed)."""
        if self._store.contains(key):
            return 0
        if self._admission is not None:
            with self._admission_lock:
                if not self._admission.second_sight(key):
                    self.not_admitted += 1
                    return 0
        if self._behind is not None:
            staged = {TENSOR_NAME: torch.from_numpy(self._rows[row].copy())}
            if self._behind.try_submit(key, staged, tenant):
                return self.row_bytes
        ok = self._store.put_row(key, TENSOR_NAME, memoryview(self._rows[row]), tenant=tenant)
        return self.row_bytes if ok else -1

    def _load_all(self, job: RowJob) -> tuple[bool, int, int]:
        self._meter.begin()
        done: list[bool] = []
        try:
            done = list(self._pool.map(lambda kr: self._load_one(kr[0], kr[1]),
                                       zip(job.keys, job.rows)))
        finally:
            self._meter.end(sum(done) * self.row_bytes)
        loaded = next((i for i, ok in enumerate(done) if not ok), len(done))
        if loaded < len(done):
            logger.warning("vlmcache KV tier: job %d: chunk %d of %d missing, corrupt or of "
                           "the wrong size: recomputed from there", job.job_id, loaded + 1,
                           len(done))
        return loaded == len(done), loaded * self.row_bytes, loaded

    def _load_one(self, key: str, row: int) -> bool:
        # straight into vLLM's row, verified there (a failed read leaves garbage in a row
        # vLLM never marks ready: the job fails, the request recomputes)
        return self._store.get_into(key, TENSOR_NAME, memoryview(self._rows[row]))


class _StagedRows:
    """Staged row copies (one uint8 tensor each) -> the store's in-place row writer."""

    def __init__(self, store: RowStore) -> None:
        self._store = store

    def put(self, key: str, tensors: Tensors, *, tenant: str | None = None) -> bool:
        row = memoryview(tensors[TENSOR_NAME].numpy())
        return self._store.put_row(key, TENSOR_NAME, row, tenant=tenant)
