"""``python -m vlmcache.serving.server_main ARGS``: vLLM's OpenAI server
(``vllm.entrypoints.openai.api_server`` run as ``__main__`` with ``ARGS``), started from a
frame with room on CPython's frame stack (:mod:`vlmcache.vllm.stack_room`).

With the fork start method (vLLM's default on CUDA) the EngineCore process continues from
the server's stack; started this way, its step loop runs inside one stack chunk and never
maps and unmaps a chunk per attention layer. With spawn (vLLM on the CPU) the engine starts
on a fresh stack and this changes nothing.
"""

from __future__ import annotations

import runpy

from vlmcache.vllm.stack_room import call_with_stack_room

SERVER_MODULE = "vllm.entrypoints.openai.api_server"


def main() -> None:
    # alter_sys: the server sees itself as __main__ (argv[0], spawned children re-import it)
    call_with_stack_room(lambda: runpy.run_module(SERVER_MODULE, run_name="__main__",
                                                  alter_sys=True))


if __name__ == "__main__":
    main()
