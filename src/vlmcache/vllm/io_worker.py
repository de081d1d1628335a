"""Where the persistent tier's I/O runs: a child process of the engine, or the caller.

With one GPU, vLLM runs the scheduler, this tier and the model runner in one process; the
tier's reads, writes and checksums (tens of MB per prompt) then compete with the model runner
for the GIL. Measured on an H100 (Qwen2-VL-7B shape): a miss with in-process writes took
2.6x recompute and a CPU-tier hit 3.5x vLLM's. :class:`ChildIO` runs the same
:class:`~vlmcache.vllm.row_io.RowMover` in a child process that maps vLLM's CPU region
(its file descriptor is inherited) and opens its own chunk store; the engine process only
writes job lines to a pipe and reads outcome lines back.

The I/O process is detached from the engine's process tree (its own session, reparented
away from the engine): at shutdown vLLM SIGKILLs the engine's descendants 5 s after SIGTERM,
and rows captured in the last seconds would die with it. It ends by itself once the engine's
end of its pipe closes and every queued job is done.

Run as ``python -m vlmcache.vllm.io_worker`` by :class:`ChildIO` only. Protocol, one JSON
object per line: parent -> child: a start message (config, region geometry, fd), then
:class:`RowJob` s; child -> parent: ``{"ready": ...}``, then :class:`JobOutcome` s and
``{"read": ...}`` throughput measurements (a start-up probe, then each busy period).
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import queue
import random
import select
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Callable, Protocol

import numpy as np

from vlmcache.store.journal import orphaned_count
from vlmcache.store.policy import GhostFilter
from vlmcache.vllm.row_io import JobOutcome, RowJob, RowMover, RowStore

if TYPE_CHECKING:
    from vlmcache.config import VlmCacheConfig

logger = logging.getLogger(__name__)

#: How long the child may take to import, open the store and map the region.
START_TIMEOUT_S = 120.0
#: Jobs waiting for the pipe to the I/O process before new ones fail (are misses).
MAX_QUEUED_JOBS = 10_000
#: Stored chunks read at start-up to measure the store's read bandwidth (cost model).
PROBE_CHUNKS = 16

Done = Callable[[RowJob, JobOutcome], None]


class RowExecutor(Protocol):
    """Runs row jobs and calls ``done`` with each outcome (on any thread)."""

    def submit(self, job: RowJob) -> None: ...

    def close(self) -> None: ...


class InlineIO:
    """Runs each job in the caller (``disk_write: sync``, tests)."""

    def __init__(self, mover: RowMover, done: Done) -> None:
        self._mover = mover
        self._done = done

    def submit(self, job: RowJob) -> None:
        self._done(job, self._mover.run(job))

    def close(self) -> None:
        self._mover.close()


class ThreadIO:
    """Runs jobs on threads of this process (when the I/O process cannot map the region)."""

    def __init__(self, mover: RowMover, done: Done, threads: int) -> None:
        self._mover = mover
        self._done = done
        self._pool = ThreadPoolExecutor(max(1, threads), "vlmcache-kv-io")

    def submit(self, job: RowJob) -> None:
        self._pool.submit(lambda: self._done(job, self._mover.run(job)))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
        self._mover.close()


def staging_bytes(config: "VlmCacheConfig") -> int:
    """Bytes of copied rows a store job may leave to be written behind: ``disk_write_queue``,
    never more than ``memory_budget`` (the copies are memory beside vLLM's region; with the
    queue alone, 78 MiB were staged under an 8 MiB budget). Rows past it are written before
    their job finishes (backpressure on the I/O threads, never on the engine's loop)."""
    return min(config.memory_budget, config.disk_write_queue)


def journal_dir(config: "VlmCacheConfig") -> Path:
    """Where the I/O process journals the rows it staged (acknowledged, not yet written):
    the next start reports those a crash lost (:mod:`vlmcache.store.journal`)."""
    from vlmcache.store.kvstore import kv_store_dir

    return kv_store_dir(config) / "journal"


def admission_for(config: "VlmCacheConfig") -> GhostFilter | None:
    """The persistent tier's write admission (``admission_disk``)."""
    if config.admission_disk != "second_sight":
        return None
    return GhostFilter(config.admission_ghost_entries)


def make_executor(config: "VlmCacheConfig", store: "RowStore", rows: np.ndarray,
                  region_fd: int | None, done: Done,
                  on_read: Callable[[int, float], None] | None = None) -> RowExecutor:
    """The executor ``config`` asks for: inline for ``disk_write: sync``, else the I/O
    process (on ``region_fd``; threads here if vLLM's region has no descriptor).
    ``on_read(bytes, seconds)``: the store's measured read throughput (start-up probe and
    each busy period of loads), for the cost model."""
    threads = config.kv_io_threads
    if config.disk_write == "sync":
        return InlineIO(RowMover(store, rows, threads, on_read, admission_for(config)), done)
    if region_fd is None:
        logger.warning("vlmcache KV tier: vLLM's CPU region has no file descriptor here: "
                       "the tier's I/O runs on threads of the engine process")
        return ThreadIO(RowMover(store, rows, threads, on_read, admission_for(config),
                                 staging_bytes=staging_bytes(config),
                                 journal_dir=journal_dir(config)), done, threads)
    start = ChildStart(config.to_dict(), region_fd, int(rows.shape[0]), int(rows.shape[1]),
                       threads)
    return ChildIO(start, done, on_read, journal_dir(config))


@dataclass(frozen=True)
class ChildStart:
    """What the child needs: vlmcache's config, the region's geometry and descriptor."""

    config: dict[str, object]
    fd: int
    num_rows: int
    row_bytes: int
    threads: int

    def to_json(self) -> str:
        return json.dumps({"config": self.config, "fd": self.fd, "num_rows": self.num_rows,
                           "row_bytes": self.row_bytes, "threads": self.threads},
                          default=str)


class ChildIO:
    """Runs row jobs in a child process (see the module docstring).

    A dead child fails its pending jobs and every later one (misses, logged once); the
    engine keeps serving by recomputing.
    """

    def __init__(self, start: ChildStart, done: Done,
                 on_read: Callable[[int, float], None] | None = None,
                 journal: Path | None = None) -> None:
        self._done = done
        self._journal = journal  # the child's staged rows, for the report if it dies
        self._on_read = on_read
        self._lock = threading.Lock()
        self._pending: dict[int, RowJob] = {}
        self._dead = False
        self._closing = False  # close() asked for the end: no error line for it
        # jobs go to the pipe from a writer thread: a wedged child fills the pipe, and the
        # scheduler must never block on it (past MAX_QUEUED_JOBS, jobs fail: misses)
        self._outbox: queue.Queue[RowJob | None] = queue.Queue(MAX_QUEUED_JOBS)
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        launcher = subprocess.Popen(
            [sys.executable, "-m", "vlmcache.vllm.io_worker"], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, pass_fds=(start.fd,), env=env, text=True, bufsize=1,
            start_new_session=True)
        assert launcher.stdin is not None and launcher.stdout is not None
        self._stdin: IO[str] = launcher.stdin
        self._stdout: IO[str] = launcher.stdout
        self._stdin.write(start.to_json() + "\n")
        self._stdin.flush()
        self.pid = self._wait_ready(launcher)
        launcher.wait()  # it forked the I/O process and exited
        self._reader = threading.Thread(target=self._read_loop, name="vlmcache-kv-io-reader",
                                        daemon=True)
        self._reader.start()
        self._writer = threading.Thread(target=self._write_loop, name="vlmcache-kv-io-writer",
                                        daemon=True)
        self._writer.start()
        logger.info("vlmcache KV tier: I/O process %d (%d threads)", self.pid,
                    start.threads)

    @property
    def dead(self) -> bool:
        """Whether the I/O process has ended (every job then fails: a miss)."""
        with self._lock:
            return self._dead

    def submit(self, job: RowJob) -> None:
        with self._lock:
            accepted = not self._dead
            if accepted:
                self._pending[job.job_id] = job
        if accepted:
            try:
                self._outbox.put_nowait(job)
                return
            except queue.Full:
                logger.warning("vlmcache KV tier: %d jobs queued for the I/O process: job %d "
                               "dropped (a miss)", MAX_QUEUED_JOBS, job.job_id)
                with self._lock:
                    self._pending.pop(job.job_id, None)
        self._done(job, JobOutcome(job.job_id, False, 0, 0.0))

    def close(self) -> None:
        """Finish every submitted job, then stop the child."""
        self._closing = True
        self._outbox.put(None)  # the writer closes the child's stdin after the last job
        self._writer.join(timeout=60)
        self._reader.join(timeout=60)  # the child's stdout ends when it does
        if self._reader.is_alive():
            logger.warning("vlmcache KV tier: I/O process did not stop; killing it")
            self.kill()
            self._reader.join(timeout=10)

    def kill(self) -> None:
        """SIGKILL the I/O process (its pending jobs then fail: misses)."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass

    def _write_loop(self) -> None:
        while (job := self._outbox.get()) is not None:
            try:
                self._stdin.write(job.to_json() + "\n")
                self._stdin.flush()
            except (OSError, ValueError):
                break  # the child is gone: the reader fails what is pending
        try:
            self._stdin.close()
        except OSError:
            pass

    def _wait_ready(self, launcher: subprocess.Popen[str]) -> int:
        """The I/O process's pid, from its ready line."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            ready, _, _ = select.select([self._stdout], [], [], 1.0)
            if ready:
                line = self._stdout.readline()
                if not line:  # every holder of the pipe is gone
                    break
                if line.startswith('{"ready"'):
                    return int(json.loads(line)["pid"])
            elif launcher.poll() not in (None, 0):
                break
        launcher.kill()
        try:  # the detached process, if it got that far, is in the launcher's session
            os.killpg(launcher.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        raise RuntimeError("vlmcache KV tier: the I/O process did not start (see its log)")

    def _read_loop(self) -> None:
        for line in self._stdout:
            try:
                msg = json.loads(line)
                if "read" in msg:
                    if self._on_read is not None:
                        self._on_read(int(msg["read"]["nbytes"]), float(msg["read"]["seconds"]))
                    continue
                outcome = JobOutcome.from_json(line)
            except (ValueError, KeyError, TypeError):
                logger.error("vlmcache KV tier: bad line from the I/O process: %.200r", line)
                continue
            with self._lock:
                job = self._pending.pop(outcome.job_id, None)
            if job is not None:
                self._done(job, outcome)
        self._fail_pending()

    def _fail_pending(self) -> None:
        with self._lock:
            self._dead = True
            jobs, self._pending = list(self._pending.values()), {}
        staged = orphaned_count(self._journal) if self._journal is not None else 0
        if not self._closing:  # an end nobody asked for is always worth a line
            logger.error("vlmcache KV tier: I/O process %d ended; %d pending jobs failed and "
                         "%d acknowledged staged rows were not written (the next start reports "
                         "them); the persistent tier is off until restart", self.pid,
                         len(jobs), staged)
        for job in jobs:
            self._done(job, JobOutcome(job.job_id, False, 0, 0.0))


# ---- the child ----------------------------------------------------------------------------


def _probe(store: object, threads: int, row_bytes: int) -> tuple[int, float] | None:
    """Read up to PROBE_CHUNKS stored chunk files in parallel as a load does (straight into
    a row-sized buffer, then the checksum over it), without touching the store's state:
    the store's read bandwidth before any load is measured."""
    keys = list(getattr(store, "keys", lambda: [])())
    path_for = getattr(store, "path_for", None)
    if not keys or path_for is None:
        return None
    picked = random.sample(keys, min(PROBE_CHUNKS, len(keys)))

    def read(key: str) -> int:
        buf = np.empty(row_bytes + 4096, dtype=np.uint8)  # payload + a safetensors header
        try:
            with open(path_for(key), "rb", buffering=0) as f:
                got = f.readinto(memoryview(buf)) or 0
        except (OSError, ValueError):
            return 0
        hashlib.sha256(memoryview(buf)[:got]).digest()
        return got

    start = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        nbytes = sum(pool.map(read, picked))
    return (nbytes, time.perf_counter() - start) if nbytes else None


def _detach() -> None:
    """Leave the engine's process tree: the launcher (already in a session of its own)
    exits, and this process is reparented away from the engine."""
    if os.fork():
        os._exit(0)


def _child_main() -> None:
    from vlmcache.config import VlmCacheConfig
    from vlmcache.store.kvstore import open_persistent_kv_store

    _detach()
    # The protocol gets its own copy of stdout; anything a library prints goes to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    # Ctrl-C reaches the whole process group: finish queued writes, stop at stdin's EOF.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="(vlmcache-kv-io pid=%(process)d) %(levelname)s %(name)s: "
                               "%(message)s")
    start = json.loads(sys.stdin.readline())
    config = VlmCacheConfig.from_dict(start["config"])
    num_rows, row_bytes = int(start["num_rows"]), int(start["row_bytes"])
    region = mmap.mmap(int(start["fd"]), num_rows * row_bytes, flags=mmap.MAP_SHARED,
                       prot=mmap.PROT_READ | mmap.PROT_WRITE)
    rows = np.frombuffer(region, dtype=np.uint8).reshape(num_rows, row_bytes)
    store = open_persistent_kv_store(config)
    out_lock = threading.Lock()

    def send(line: str) -> None:
        with out_lock:
            proto.write(line + "\n")
            proto.flush()

    def read(nbytes: int, seconds: float) -> None:
        send(json.dumps({"read": {"nbytes": nbytes, "seconds": seconds}}))

    mover = RowMover(store, rows, int(start["threads"]), on_read=read,
                     admission=admission_for(config), staging_bytes=staging_bytes(config),
                     journal_dir=journal_dir(config))
    send(json.dumps({"ready": True, "pid": os.getpid()}))
    probe = _probe(store, int(start["threads"]), int(start["row_bytes"]))
    if probe is not None:
        read(*probe)
    with ThreadPoolExecutor(max(1, int(start["threads"]) // 2), "vlmcache-kv-job") as jobs:
        for line in sys.stdin:
            job = RowJob.from_json(line)
            jobs.submit(lambda j=job: send(mover.run(j).to_json()))
    mover.close()


if __name__ == "__main__":
    _child_main()
