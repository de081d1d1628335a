"""The persistent KV tier's logic: vLLM's CPU offload rows <-> vlmcache's chunk store.

vLLM's tiering offloader keeps a CPU *primary* tier: a shared memory region of fixed-size
rows, one row per offloaded chunk (the KV of ``tokens_per_chunk`` tokens from every worker,
in rank order, so a row is the whole block of every TP rank). :class:`PersistentKV` copies
rows to and from a :class:`~vlmcache.store.base.ChunkStore` on its own I/O threads; the
vLLM-facing :mod:`vlmcache.vllm.offload_tier` only translates vLLM's calls into these.

Keys: vLLM's offload key (its block hash, which folds the request's ``cache_salt`` and
image identifiers into a chain rooted in ``PYTHONHASHSEED``) is hashed together with the
vlmcache namespace digest (model, weights, processor, KV layout incl. TP size, salt), so a
chunk is only ever reloaded by an engine of the identical configuration and tenant.
Every read is checksummed by the store; a fault is a failed job, which vLLM treats as a miss.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Protocol, Sequence

import numpy as np
import torch

from vlmcache.store.base import Tensors
from vlmcache.vllm.cost import CostDecision, CostModel

logger = logging.getLogger(__name__)

TENSOR_NAME = "kv"
#: Requests whose per-request tier report is kept until the connector collects it.
MAX_TRACKED_REQUESTS = 4096


class RowStore(Protocol):
    """What the tier needs of a chunk store (``DiskStore`` fits)."""

    def contains(self, key: str) -> bool: ...

    def get(self, key: str) -> dict[str, torch.Tensor] | None: ...

    def put(self, key: str, tensors: Tensors) -> bool: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class JobOutcome:
    """A finished store or load job."""

    job_id: int
    success: bool
    nbytes: int
    seconds: float
    #: a failed load's leading keys that did load (their prefix is usable); None: all or none
    loaded_keys: tuple[bytes, ...] | None = None


@dataclass
class TierRequestReport:
    """What the persistent tier decided for one request (the ReuseReport's cost fields)."""

    chunks_found: int = 0
    chunks_loaded: int = 0
    chunks_skipped: int = 0
    chunks_failed: int = 0
    decision: CostDecision | None = None
    stored_chunks: int = 0

    def to_params(self) -> dict[str, object]:
        out: dict[str, object] = {"persistent_chunks_found": self.chunks_found,
                                  "persistent_chunks_loaded": self.chunks_loaded,
                                  "persistent_chunks_failed": self.chunks_failed,
                                  "persistent_chunks_stored": self.stored_chunks}
        # a choice is reported where it mattered: rows found, or loading ruled out
        if self.decision is not None and (self.chunks_found or self.decision.choice == "skip"):
            out["cost_model_choice"] = self.decision.choice
            out["cost_model_reason"] = self.decision.reason
        return out


@dataclass
class _Ledger:
    """Per-request reports, bounded (a request that never finishes cannot leak)."""

    reports: OrderedDict[str, TierRequestReport] = field(default_factory=OrderedDict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def get(self, req_id: str) -> TierRequestReport:
        with self.lock:
            report = self.reports.get(req_id)
            if report is None:
                report = self.reports[req_id] = TierRequestReport()
                while len(self.reports) > MAX_TRACKED_REQUESTS:
                    self.reports.popitem(last=False)
            return report

    def pop(self, req_id: str) -> TierRequestReport | None:
        with self.lock:
            return self.reports.pop(req_id, None)


def store_key(namespace_digest: str, offload_key: bytes) -> str:
    """The chunk store key of vLLM offload key ``offload_key`` under a namespace."""
    return hashlib.sha256(namespace_digest.encode() + b"\0kv-row\0" + offload_key).hexdigest()


class PersistentKV:
    """Moves offload rows between vLLM's primary region and a chunk store.

    ``rows`` is a ``(num_rows, row_bytes)`` uint8 view of the primary region. Jobs run on
    ``io_threads`` threads (``sync=True``: in the caller, for tests and ``disk_write: sync``).
    """

    def __init__(self, store: RowStore, rows: np.ndarray, namespace_digest: str,
                 tokens_per_chunk: int, cost: CostModel, *, io_threads: int = 4,
                 sync: bool = False, save: bool = True) -> None:
        if rows.ndim != 2 or rows.dtype != np.uint8:
            raise ValueError("rows must be a 2-D uint8 array")
        self._store = store
        self._rows = rows
        self._ns = namespace_digest
        self.tokens_per_chunk = tokens_per_chunk
        self.cost = cost
        self._sync = sync
        self._save = save  # False: rows are never written (enable_kv_save off)
        self._pool = None if sync else ThreadPoolExecutor(io_threads, "vlmcache-kv-io")
        self._pending: set[Future[None]] = set()
        self._done: list[JobOutcome] = []
        self._lock = threading.Lock()
        self.ledger = _Ledger()

    @property
    def row_bytes(self) -> int:
        return int(self._rows.shape[1])

    # ---- scheduler-facing calls (must not block) ------------------------------------------

    def lookup(self, offload_key: bytes, req_id: str) -> bool:
        """Whether to promise ``offload_key`` for ``req_id``: stored and cheaper than recompute."""
        # decided first: a row not worth loading is not written either (see _store_job)
        decision = self.cost.decide(self.tokens_per_chunk, self.row_bytes)
        report = self.ledger.get(req_id)
        if report.decision is None or report.decision.choice != decision.choice:
            logger.info("vlmcache KV tier: request %s: %s from disk (%s)", req_id,
                        decision.choice, decision.reason)
        report.decision = decision
        if decision.choice == "skip":
            report.chunks_skipped += 1
            return False
        if not self._store.contains(store_key(self._ns, offload_key)):
            return False
        report.chunks_found += 1
        return True

    def submit_store(self, job_id: int, keys: Sequence[bytes], rows: Sequence[int],
                     req_id: str | None = None) -> None:
        """Persist rows ``rows`` under ``keys`` (already in the store: kept, not rewritten)."""
        if req_id is not None:
            self.ledger.get(req_id).stored_chunks += len(keys)
        self._submit(self._store_job, job_id, list(keys), list(rows))

    def submit_load(self, job_id: int, keys: Sequence[bytes], rows: Sequence[int],
                    req_id: str | None = None) -> None:
        """Read ``keys`` into rows ``rows``."""
        self._submit(self._load_job, job_id, list(keys), list(rows), req_id)

    def finished(self) -> list[JobOutcome]:
        """Jobs finished since the last call."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def has_pending(self) -> bool:
        with self._lock:
            return bool(self._pending or self._done)

    def drain(self) -> None:
        """Wait until every submitted job has finished (its outcome stays queued)."""
        with self._lock:
            pending = list(self._pending)
        wait(pending)

    def shutdown(self) -> None:
        """Finish every job, close the store and drop the view of vLLM's region (so vLLM
        can unmap it)."""
        self.drain()
        if self._pool is not None:
            self._pool.shutdown(wait=True)
        self._store.close()
        self._rows = np.zeros((0, self.row_bytes), dtype=np.uint8)

    # ---- I/O --------------------------------------------------------------------------------

    def _submit(self, fn, job_id: int, *args) -> None:  # type: ignore[no-untyped-def]
        if self._pool is None:
            self._run(fn, job_id, *args)
            return
        future = self._pool.submit(self._run, fn, job_id, *args)
        with self._lock:
            self._pending.add(future)
        future.add_done_callback(self._forget)

    def _forget(self, future: Future[None]) -> None:
        with self._lock:
            self._pending.discard(future)

    def _run(self, fn, job_id: int, *args) -> None:  # type: ignore[no-untyped-def]
        start = time.perf_counter()
        loaded: tuple[bytes, ...] | None = None
        try:
            ok, nbytes, loaded = fn(*args)
        except Exception:  # a cache fault is a failed job (a miss), never a crash
            logger.exception("vlmcache KV tier: job %d failed", job_id)
            ok, nbytes = False, 0
        outcome = JobOutcome(job_id, ok, nbytes, time.perf_counter() - start,
                             None if ok else loaded)
        with self._lock:
            self._done.append(outcome)

    def _store_job(self, keys: list[bytes], rows: list[int]) -> tuple[bool, int, None]:
        ok, nbytes = True, 0
        # the policy: a row the cost model would never load is not worth writing
        worth = self._save and self.cost.decide(self.tokens_per_chunk, self.row_bytes).choice \
            == "load"
        for key, row in zip(keys if worth else (), rows):
            skey = store_key(self._ns, key)
            if self._store.contains(skey):
                continue
            data = torch.from_numpy(self._rows[row])
            ok = self._store.put(skey, {TENSOR_NAME: data}) and ok
            nbytes += self.row_bytes
        return ok, nbytes, None

    def _load_job(self, keys: list[bytes], rows: list[int],
                  req_id: str | None) -> tuple[bool, int, tuple[bytes, ...]]:
        start = time.perf_counter()
        nbytes = 0
        for i, (key, row) in enumerate(zip(keys, rows)):
            tensors = self._store.get(store_key(self._ns, key))
            kv = tensors.get(TENSOR_NAME) if tensors is not None else None
            if kv is None or kv.dtype != torch.uint8 or kv.numel() != self.row_bytes:
                logger.warning("vlmcache KV tier: chunk for request %s missing or of the wrong "
                               "size: recomputed", req_id)
                self._note_load(req_id, ok=False)
                self._note_load(req_id, ok=True, chunks=i)
                return False, nbytes, tuple(keys[:i])
            self._rows[row][:] = kv.numpy().reshape(-1)
            nbytes += self.row_bytes
        self.cost.observe_read(nbytes, time.perf_counter() - start)
        self._note_load(req_id, ok=True, chunks=len(keys))
        return True, nbytes, tuple(keys)

    def _note_load(self, req_id: str | None, *, ok: bool, chunks: int = 1) -> None:
        if req_id is None or chunks == 0:
            return
        report = self.ledger.get(req_id)
        if ok:
            report.chunks_loaded += chunks
        else:
            report.chunks_failed += chunks
