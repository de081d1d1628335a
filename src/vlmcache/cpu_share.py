"""Where the front's compute runs on the host's CPUs, so that it never starves vLLM's.

On a GPU host the scarce resource is the GPU, and vLLM keeps it busy from the CPU: its API
server prepares inputs (decoding, the HF processor), its engine core schedules and, eager,
launches every kernel from one Python thread. The front's compute (image and frame
verification, thumbnails, embeddings, records) competes with them for the same cores; under
load it can take them all (eight proxy workers, each with its own verifier threads), and
then the engine's launch loop waits for a core and the GPU idles (``results/serve-gpu.json``:
ours' GPU busy 45% at 112 req/s, its prefill mean 271 ms against 160 at 84).

So the front leaves ``engine_cpus`` of the CPUs this process may use to vLLM: its proxy
processes (:func:`pin_process`) and its helper threads in any layout
(:func:`thread_initializer`, for every pool the front starts) run on the others. In the
proxy's own processes those threads also run at a lower priority (``front_thread_nice``);
inside vLLM's API server they never do: a deprioritized thread that holds the GIL when the
OS preempts it stalls every other thread of the process, vLLM's event loop included.
vLLM's own processes are left unpinned: the scheduler puts them on the CPUs the front
leaves free. A host too small to
leave at least :data:`MIN_FRONT_CPUS` to the front is not partitioned. Nothing here can
fail a request: a refused call (no permission, not Linux) is logged once and ignored.
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass
from typing import Callable

logger = logging.getLogger(__name__)

#: Fewer CPUs than this left to the front: the host is not partitioned at all.
MIN_FRONT_CPUS = 2


@dataclass(frozen=True)
class CpuShare:
    """The front's share of the host: ``cpus`` (``None``: every CPU, not partitioned), how
    many CPUs that is (``count``) and the niceness increment of its helper threads."""

    cpus: frozenset[int] | None
    nice: int
    count: int


def allowed_cpus() -> frozenset[int]:
    """The CPUs this process may run on (its affinity, e.g. under ``taskset`` or a
    container's cpuset, as it was before :func:`pin_process`), or
    ``range(os.cpu_count())`` where affinity is not available."""
    if _BEFORE_PIN is not None:
        return _BEFORE_PIN
    if hasattr(os, "sched_getaffinity"):
        return frozenset(os.sched_getaffinity(0))
    return frozenset(range(os.cpu_count() or 1))


def plan(engine_cpus: int, nice: int, allowed: frozenset[int] | None = None) -> CpuShare:
    """Leave the lowest-numbered ``engine_cpus`` of ``allowed`` (this process's CPUs) to
    vLLM and give the front the rest, when at least :data:`MIN_FRONT_CPUS` remain."""
    allowed = allowed_cpus() if allowed is None else allowed
    rest = frozenset(sorted(allowed)[engine_cpus:])
    if engine_cpus <= 0 or len(rest) < MIN_FRONT_CPUS:
        return CpuShare(None, nice, len(allowed))
    return CpuShare(rest, nice, len(rest))


_BEFORE_PIN: frozenset[int] | None = None  # the process's CPUs before pin_process
_SHARE = CpuShare(None, 0, len(allowed_cpus()))
_WARNED: set[str] = set()


def configure(share: CpuShare) -> None:
    """Set this process's share; pools started afterwards apply it to their threads."""
    global _SHARE
    _SHARE = share
    if share.cpus is not None:
        logger.info("vlmcache front: compute threads on CPUs %s at nice +%d; the other "
                    "CPUs left to vLLM (engine_cpus)", _ranges(share.cpus), share.nice)


def current() -> CpuShare:
    """This process's share (every CPU, priority unchanged, until :func:`configure`)."""
    return _SHARE


def thread_initializer() -> Callable[[], None]:
    """A ``ThreadPoolExecutor`` initializer that moves each of the pool's threads, when it
    starts, onto the front's CPUs at its priority (threads they start inherit both)."""
    return lambda: _apply(_SHARE, threading.get_native_id())


def pin_process(share: CpuShare) -> None:
    """Pin this whole process (every thread it starts from now on: its event loop, torch's
    and OpenMP's threads) to the front's CPUs. For ``vlmcache proxy``'s workers, which are
    the front's own processes; priority is left alone (their event loops relay tokens)."""
    global _BEFORE_PIN
    if share.cpus is not None:
        before = allowed_cpus()  # a later plan() is made from these, not from the share
        _call("affinity", lambda: os.sched_setaffinity(0, share.cpus))
        _BEFORE_PIN = before


def _apply(share: CpuShare, tid: int) -> None:
    if share.cpus is not None:
        # pid 0 is the calling thread on Linux: only this pool thread moves
        _call("affinity", lambda: os.sched_setaffinity(0, share.cpus))
    if share.nice > 0:
        _call("priority", lambda: os.setpriority(
            os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + share.nice))


def _call(what: str, fn: Callable[[], object]) -> None:
    try:
        fn()
    except (AttributeError, OSError, ValueError) as exc:  # not Linux, no permission
        if what not in _WARNED:
            _WARNED.add(what)
            logger.warning("vlmcache front: could not set its threads' CPU %s (%s); "
                           "they run where the OS puts them", what, exc)


def _ranges(cpus: frozenset[int]) -> str:
    out: list[str] = []
    for cpu in sorted(cpus):
        if out and out[-1].endswith(f"-{cpu - 1}"):
            out[-1] = out[-1].rsplit("-", 1)[0] + f"-{cpu}"
        elif out and out[-1] == str(cpu - 1):
            out[-1] = f"{cpu - 1}-{cpu}"
        else:
            out.append(str(cpu))
    return ",".join(out)
