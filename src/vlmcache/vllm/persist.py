"""The persistent KV tier's logic: vLLM's CPU offload rows <-> vlmcache's chunk store.

vLLM's tiering offloader keeps a CPU *primary* tier: a shared memory region of fixed-size
rows, one row per offloaded chunk (the KV of ``tokens_per_chunk`` tokens from every worker,
in rank order, so a row is the whole block of every TP rank). :class:`PersistentKV` decides
what to promise and what to write; a :class:`~vlmcache.vllm.io_worker.RowExecutor` moves
the bytes (in the tier's I/O process by default). The vLLM-facing
:mod:`vlmcache.vllm.offload_tier` only translates vLLM's calls into these.

Keys: vLLM's offload key (its block hash, which folds the request's ``cache_salt`` and
image identifiers into a chain rooted in ``PYTHONHASHSEED``) is hashed together with the
vlmcache namespace digest (model, weights, processor, KV layout incl. TP size, salt), so a
chunk is only ever reloaded by an engine of the identical configuration and tenant.

Cost: the load-or-recompute choice is made once per request, for its whole stored prefix
(:meth:`PersistentKV.plan`): one fixed cost and all the prefix's bytes against recomputing all
its tokens. The connector hands the tier the request's chunk keys when it first sees the
request (:meth:`PersistentKV.expect`); the plan is made at the tier's first lookup for it,
which vLLM makes only for a chunk its CPU tier lacks, so a CPU-tier hit never touches the
store (41 file checks and key hashes on a Qwen2-VL-7B-shaped CPU hit's scheduling step).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from vlmcache.keys import kv_row_key
from vlmcache.vllm.cost import CostDecision, CostModel
from vlmcache.vllm.io_worker import ChildIO, RowExecutor
from vlmcache.vllm.row_io import JobOutcome, RowJob

logger = logging.getLogger(__name__)

#: Requests whose per-request tier report is kept until the connector collects it.
MAX_TRACKED_REQUESTS = 4096
#: store keys remembered as unreadable (a failed load) until written again
UNREADABLE_MAX = 65_536


class KeyIndex(Protocol):
    """Whether the store holds a key (the scheduler's side-effect-free lookup)."""

    def contains(self, key: str) -> bool: ...


@dataclass(frozen=True)
class FinishedJob:
    """A finished job in vLLM's terms: a failed load's leading ``loaded_keys`` did load."""

    job_id: int
    success: bool
    nbytes: int
    seconds: float
    loaded_keys: tuple[bytes, ...] | None = None


@dataclass
class TierRequestReport:
    """What the persistent tier decided for one request (the ReuseReport's cost fields)."""

    chunks_found: int = 0
    chunks_loaded: int = 0
    chunks_skipped: int = 0
    chunks_failed: int = 0
    decision: CostDecision | None = None
    #: True once ``plan`` ran: ``decision`` then covers the request's whole stored prefix
    planned: bool = False
    stored_chunks: int = 0
    #: the request's chunks beyond vLLM's GPU prefix (vLLM's offload keys, in order), until
    #: the plan is made from them
    expected: tuple[bytes, ...] = field(default=(), repr=False)

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


@dataclass(frozen=True)
class TierGeometry:
    """The namespace every key is bound to, and one row's size in tokens and bytes."""

    namespace_digest: str
    tokens_per_chunk: int
    row_bytes: int


class PersistentKV:
    """Decides what the persistent tier promises and writes; an executor moves the bytes.

    ``make_io(done)`` builds the executor that will call ``done(job, outcome)``.
    """

    def __init__(self, index: KeyIndex, geometry: TierGeometry, cost: CostModel,
                 make_io: Callable[[Callable[[RowJob, JobOutcome], None]], RowExecutor], *,
                 save: bool = True) -> None:
        self._index = index
        self._geo = geometry
        self.cost = cost
        self._save = save  # False: rows are never written (enable_kv_save off)
        self._pending: dict[int, _Submitted] = {}
        self._done: list[FinishedJob] = []
        # store keys a load found missing or damaged: the scheduler's index (built when this
        # process opened the store) still lists them, and promising them again would send
        # vLLM into a load-fail-lookup loop; forgotten when the key is written again
        self._unreadable: OrderedDict[str, None] = OrderedDict()
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self.ledger = _Ledger()
        self._skip_logged = False
        self._io = make_io(self._on_outcome)

    @property
    def tokens_per_chunk(self) -> int:
        return self._geo.tokens_per_chunk

    @property
    def row_bytes(self) -> int:
        return self._geo.row_bytes

    @property
    def io_in_engine_process(self) -> bool:
        """Whether the tier's I/O runs on threads of this (the engine's) process."""
        return not isinstance(self._io, ChildIO)

    def key_for(self, offload_key: bytes) -> str:
        return kv_row_key(self._geo.namespace_digest, offload_key)

    # ---- scheduler-facing calls (side-effect free on the store, never block on I/O) --------

    def expect(self, req_id: str, offload_keys: Sequence[bytes]) -> None:
        """Note ``req_id``'s chunks not already in vLLM's GPU cache (vLLM's offload keys, in
        order); the load-or-skip plan is made from them at this tier's first lookup for the
        request (:meth:`lookup`). Nothing is hashed or asked of the store here."""
        if offload_keys:
            self.ledger.get(req_id).expected = tuple(offload_keys)

    def plan(self, req_id: str, offload_keys: Sequence[bytes]) -> CostDecision | None:
        """Decide load-or-skip once for ``req_id``'s stored prefix (``offload_keys``: vLLM's
        offload keys of its chunks from the first one vLLM lacks, in order). With nothing
        stored: a skip where loading all of them would lose (the tier never writes such
        rows, so the ReuseReport says why nothing was loaded), else ``None`` (a plain miss).
        Either way the request's lookups then miss without asking the store again."""
        stored = 0
        for key in offload_keys:
            if not self._stored(self.key_for(key)):
                break
            stored += 1
        report = self.ledger.get(req_id)
        report.planned, report.expected = True, ()
        n = stored or len(offload_keys)
        if not n:
            return None
        decision = self.cost.decide(n * self.tokens_per_chunk, n * self.row_bytes)
        if not stored and decision.choice == "load":
            return None
        report.decision = decision
        # INFO comes at the request's end, where rows were found (vLLM's CPU tier may serve
        # them first): here, in the scheduler's step, only DEBUG
        logger.debug("vlmcache KV tier: request %s: %s %d stored chunks (%s)", req_id,
                     decision.choice, stored, decision.reason)
        return decision

    def lookup(self, offload_key: bytes, req_id: str) -> bool:
        """Whether to promise ``offload_key`` for ``req_id``: stored and worth loading."""
        report = self.ledger.get(req_id)
        if not report.planned and report.expected:
            self._plan_from(req_id, report.expected, offload_key)
        if report.decision is None:
            if report.planned:  # the plan found nothing stored for this request
                return False
            # a lookup outside the connector (no plan): decide for this chunk alone
            report.decision = self.cost.decide(self.tokens_per_chunk, self.row_bytes)
        if report.decision.choice == "skip":
            report.chunks_skipped += 1
            return False
        if not self._stored(self.key_for(offload_key)):
            return False
        report.chunks_found += 1
        return True

    def _stored(self, store_key: str) -> bool:
        """Whether the store holds ``store_key`` and no load found it unreadable, with the
        executor alive (a dead I/O process loads nothing: promising would only fail)."""
        if getattr(self._io, "dead", False):
            return False
        with self._lock:
            if store_key in self._unreadable:
                return False
        return self._index.contains(store_key)

    def _plan_from(self, req_id: str, expected: tuple[bytes, ...], first: bytes) -> None:
        """Plan from ``first``, the first chunk vLLM looked for beyond its CPU tier; a key
        the connector did not hand over (another KV group) is decided chunk by chunk."""
        try:
            at = expected.index(first)
        except ValueError:
            return
        self.plan(req_id, expected[at:])

    def writes_pay(self, n_chunks: int) -> bool:
        """Whether ``submit_store`` would write ``n_chunks`` rows now."""
        n = max(1, n_chunks)
        return self._save and self.cost.decide(n * self.tokens_per_chunk,
                                               n * self.row_bytes).choice == "load"

    def submit_store(self, job_id: int, keys: Sequence[bytes], rows: Sequence[int],
                     req_id: str | None = None, tenant: str | None = None) -> None:
        """Persist rows ``rows`` under ``keys`` when loading them could ever win (a row the
        cost model would never load is not worth its disk bytes); stored keys are kept."""
        n = len(keys)
        decision = self.cost.decide(n * self.tokens_per_chunk, n * self.row_bytes)
        if req_id is not None:
            report = self.ledger.get(req_id)
            report.stored_chunks += n
            if decision.choice == "skip" and report.decision is None:
                report.decision = decision  # the ReuseReport says why nothing was written
        if decision.choice == "skip" and not self._skip_logged:
            self._skip_logged = True  # once: the choice holds while the rates do
            logger.info("vlmcache KV tier: not writing rows, loading them would lose: %s",
                        decision.reason)
        if not (self._save and n and decision.choice == "load"):
            with self._lock:
                self._done.append(FinishedJob(job_id, True, 0, 0.0))
            return
        self._submit(RowJob(job_id, "store", tuple(self.key_for(k) for k in keys),
                            tuple(rows), tenant), keys, req_id)

    def submit_load(self, job_id: int, keys: Sequence[bytes], rows: Sequence[int],
                    req_id: str | None = None) -> None:
        """Read ``keys`` into rows ``rows``."""
        self._submit(RowJob(job_id, "load", tuple(self.key_for(k) for k in keys),
                            tuple(rows)), keys, req_id)

    def finished(self) -> list[FinishedJob]:
        """Jobs finished since the last call."""
        with self._lock:
            done, self._done = self._done, []
        return done

    def has_pending(self) -> bool:
        with self._lock:
            return bool(self._pending or self._done)

    def drain(self, timeout_s: float | None = None) -> None:
        """Wait until every submitted job has finished (its outcome stays queued)."""
        with self._idle:
            self._idle.wait_for(lambda: not self._pending, timeout_s)

    def shutdown(self) -> None:
        """Finish every job and stop the executor (which closes its store and drops its view
        of vLLM's region, so vLLM can unmap it)."""
        self.drain(timeout_s=60)
        self._io.close()

    # ---- outcomes ----------------------------------------------------------------------------

    def _submit(self, job: RowJob, offload_keys: Sequence[bytes], req_id: str | None) -> None:
        with self._lock:
            self._pending[job.job_id] = _Submitted(tuple(offload_keys), req_id)
        self._io.submit(job)

    def _on_outcome(self, job: RowJob, outcome: JobOutcome) -> None:
        with self._lock:
            sub = self._pending.get(job.job_id) or _Submitted((), None)
        if job.kind == "load":
            self._note_load(sub.req_id, outcome, len(job.keys))
        self._note_readable(job, outcome)
        # vLLM 0.32 keeps a failed load's leading keys that did load (0.26: all or none)
        loaded = None if outcome.success else sub.offload_keys[:outcome.loaded]
        finished = FinishedJob(job.job_id, outcome.success, outcome.nbytes, outcome.seconds,
                               loaded)
        with self._idle:
            self._pending.pop(job.job_id, None)
            self._done.append(finished)
            self._idle.notify_all()

    def _note_readable(self, job: RowJob, outcome: JobOutcome) -> None:
        """A failed load's first unread key is unreadable until written again."""
        with self._lock:
            if job.kind == "store" and outcome.success:
                for key in job.keys:
                    self._unreadable.pop(key, None)
            elif job.kind == "load" and not outcome.success and outcome.loaded < len(job.keys):
                self._unreadable[job.keys[outcome.loaded]] = None
                while len(self._unreadable) > UNREADABLE_MAX:
                    self._unreadable.popitem(last=False)

    def _note_load(self, req_id: str | None, outcome: JobOutcome, chunks: int) -> None:
        """Count the request's loaded and failed chunks (the executor measures throughput)."""
        if req_id is None:
            return
        report = self.ledger.get(req_id)
        report.chunks_loaded += outcome.loaded
        report.chunks_failed += chunks - outcome.loaded if not outcome.success else 0


@dataclass(frozen=True)
class _Submitted:
    offload_keys: tuple[bytes, ...]
    req_id: str | None
