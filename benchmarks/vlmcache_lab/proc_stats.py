"""Where a GPU benchmark mode's CPU time goes: per thread of its session's processes (the
mode's process, its engine's, its I/O process), and the core each request's engine ran on.

Engines taking turns on one GPU should use CPU only in their turns; one that spins between
them slows the others. And a small prefill is CPU-bound (kernel launches): the same engine
ran one phase's GPU hits at 9 ms and the next phase's at 14 ms (H200, 2026-11-26), so each
request also records the core its engine's main thread was on.
"""

from __future__ import annotations

import os
from collections import Counter

#: threads listed per phase in ``cpu_by_thread`` (the busiest)
TOP_THREADS = 8
#: ``PF_KTHREAD`` in a stat file's flags: a kernel thread
_KERNEL_THREAD = 0x00200000


def _stat_fields(path: str) -> tuple[str, list[str]] | None:
    """(name, fields after the name) of a ``/proc/.../stat`` file, or ``None`` if gone."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return None
    head, _, rest = text.rpartition(")")
    return head.partition("(")[2], rest.split()


def _session_procs() -> list[tuple[int, str, list[str]]]:
    """(pid, name, stat fields after the name) of each process of this session. Kernel
    threads are left out: in a container whose session leader lies outside its pid namespace
    the session reads 0, as theirs does (a CI run counted a ``kworker`` as the busiest)."""
    sid, procs = os.getsid(0), []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            got = _stat_fields(f"/proc/{entry}/stat")
            # fields after the name: state, ppid, pgrp, session, tty_nr, tpgid, flags, ...
            if (got is not None and int(got[1][3]) == sid
                    and not int(got[1][6]) & _KERNEL_THREAD):
                procs.append((int(entry), got[0], got[1]))
    return procs


def _process_stats() -> dict[str, tuple[float, int]]:
    """(CPU seconds, minor faults) so far of each process of this session, keyed ``name:pid``
    (a process's CPU time includes its threads that have ended)."""
    tick = os.sysconf("SC_CLK_TCK")
    # fields 10, 14, 15: minflt, utime, stime
    return {f"{name}:{pid}": ((int(f[11]) + int(f[12])) / tick, int(f[7]))
            for pid, name, f in _session_procs()}


def session_cpu_s() -> float:
    """CPU seconds used so far by this process's session (a mode's process, its engine's
    processes): with engines taking turns, far more than the time this mode held its turns
    means an engine spun while it waited, and slowed the others."""
    return sum(cpu for cpu, _ in _process_stats().values())


def thread_cpu_s() -> Counter[str]:
    """CPU seconds so far of each thread of this session, keyed ``process:pid/tid`` (``main``
    for a process's main thread; Python threads carry no name the kernel sees)."""
    tick, out = os.sysconf("SC_CLK_TCK"), Counter()
    for pid, pname, _ in _session_procs():
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            got = _stat_fields(f"/proc/{pid}/task/{tid}/stat")
            if got is not None:  # utime, stime: fields 14 and 15
                thread = "main" if int(tid) == pid else tid
                out[f"{pname}:{pid}/{thread}"] += (int(got[1][11]) + int(got[1][12])) / tick
    return out


def minor_faults() -> Counter[str]:
    """Minor page faults so far of each process of this session, keyed ``name:pid``: a
    process that keeps mapping fresh memory (CPython frame-stack chunks mapped and unmapped
    per call where a chunk boundary sits in a hot loop: ``vllm/stack_room.py``) faults on
    every page it touches again."""
    return Counter({k: faults for k, (_, faults) in _process_stats().items()})


def busiest(before: Counter[str], after: Counter[str], top: int = TOP_THREADS) -> list[
        tuple[str, float]]:
    """The keys that grew the most between two snapshots (:func:`thread_cpu_s`,
    :func:`minor_faults`)."""
    spent = Counter({k: v - before.get(k, 0.0) for k, v in after.items()})
    return [(k, round(v, 3)) for k, v in spent.most_common(top) if v > 0]


def engine_core_cpu() -> int | None:
    """The core the main thread of this process's EngineCore child last ran on (``None``
    when there is none: an engine in this process)."""
    for _, name, fields in _session_procs():
        if name.startswith("VLLM::EngineCor"):  # the kernel keeps 15 characters of a name
            return int(fields[36])  # field 39: processor
    return None
