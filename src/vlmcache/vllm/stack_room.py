"""Start vLLM's engine with room on CPython's frame stack, so that its step loop never maps
and unmaps memory on every attention layer.

CPython 3.11+ keeps the frames of Python calls on a per-thread data stack made of chunks
(16 KiB by default). A chunk is allocated (``mmap``) when a call does not fit in the current
one and unmapped as soon as the call that opened it returns. Where a chunk boundary falls
between a loop and the calls it makes, every one of those calls maps, faults in and unmaps
a fresh chunk: measured here, a call/return pair costs 8.5 us instead of 0.1 us, and on an
H200 the engine's main thread spent ~4 ms more per request (``munmap``/``mmap`` under
vLLM's per-layer attention ops) in an engine started two frames deeper than plain vLLM.

Where the boundaries fall depends only on how deep the engine's loop runs: with the fork
start method (vLLM's default on CUDA) the EngineCore process continues from the stack that
started it. Starting the engine from a frame that opens a chunk with tens of KiB of free
space puts the whole step loop (scheduler, model runner, every layer) inside one chunk that
lives as long as the engine: no boundary is left to cross. The frame is an ordinary call
whose code object declares a larger value stack (``co_stacksize``); nothing is evaluated.
"""

from __future__ import annotations

import sys
import types
from typing import Callable, TypeVar

T = TypeVar("T")

#: words (8 bytes) of unused value stack in the trampoline's frame: with CPython's 1000 words
#: of overhead this asks for more than 64 KiB, so the chunk it opens is 128 KiB and ~70 KiB
#: of it is left for the calls made from the frame (an engine step uses ~20 KiB)
ROOM_WORDS = 7200


def _trampoline(fn: Callable[[], T]) -> T:
    return fn()


def _roomy(fn: Callable[..., T]) -> Callable[..., T]:
    code = fn.__code__
    return types.FunctionType(code.replace(co_stacksize=code.co_stacksize + ROOM_WORDS),
                              fn.__globals__, fn.__name__)


_ROOMY_TRAMPOLINE = _roomy(_trampoline)


def call_with_stack_room(fn: Callable[[], T]) -> T:
    """``fn()``, called from a frame that opens a fresh, large chunk of CPython's data stack.

    Everything ``fn`` calls (and, after a fork inside it, everything the child process
    runs) fits in that chunk. A no-op wrapper on Pythons without chunked frame stacks
    (before 3.11).
    """
    if sys.version_info < (3, 11):
        return fn()
    return _ROOMY_TRAMPOLINE(fn)
