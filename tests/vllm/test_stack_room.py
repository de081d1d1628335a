"""The engine's start frame leaves room on CPython's frame stack (``vllm/stack_room.py``)."""

from __future__ import annotations

import os
import resource
import sys

import pytest

from vlmcache.vllm.stack_room import call_with_stack_room

pytestmark = pytest.mark.skipif(sys.version_info < (3, 11),
                                reason="chunked frame stacks came with CPython 3.11")

CALLS = 2000


def _leaf() -> int:
    return 1


def _loop() -> None:
    for _ in range(CALLS):
        _leaf()


def _descend(depth: int) -> None:
    if depth == 0:
        _loop()
    else:
        _descend(depth - 1)


def _faults_at(depth: int) -> int:
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    _descend(depth)
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


def _thrashing_depths() -> list[int]:
    """Depths where each of the loop's calls maps a fresh stack chunk (a page fault each)."""
    return [d for d in range(300) if _faults_at(d) >= CALLS]


def test_a_loop_at_a_chunk_boundary_faults_on_every_call_and_room_removes_it():
    bad = _thrashing_depths()
    assert bad, "no chunk boundary within 300 frames: the mechanism changed"
    for depth in bad:
        assert call_with_stack_room(lambda: _faults_at(depth)) < CALLS // 10


def test_a_process_forked_inside_the_room_never_crosses_a_boundary():
    """What an EngineCore forked by ``vllm.LLM`` inside ``call_with_stack_room`` runs on."""
    def fork_and_scan() -> int:
        pid = os.fork()
        if pid == 0:
            os._exit(min(len(_thrashing_depths()), 100))
        return os.waitpid(pid, 0)[1]

    status = call_with_stack_room(fork_and_scan)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def test_the_call_returns_what_the_function_returns_and_raises_what_it_raises():
    assert call_with_stack_room(lambda: 42) == 42
    with pytest.raises(KeyError):
        call_with_stack_room(lambda: {}["x"])
