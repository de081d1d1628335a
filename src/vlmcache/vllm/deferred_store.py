"""GPU->CPU stores submitted one engine step later than vLLM submits them.

vLLM's offloading connector holds a step's store jobs until the start of the next step, "so
that offloading starts AFTER transfers related to token sampling". Submitting a store is work
on the engine's main thread (vLLM builds the batch of block copies: ``swap_blocks_batch`` in
py-spy stacks of a capturing GPU hit, ``benchmarks/diagnostics/offload_copy/`` at commit 3d85877), and
under asynchronous scheduling (vLLM's default on the GPU) the next step starts before the
engine has taken the previous step's output, so that work ran ahead of the answer. The
copies themselves do not hold the sampled token back (the same README's token-race runs). A
GPU prefix hit whose blocks vlmcache captures for its persistent tier (a Qwen2-VL-7B-shaped
prompt: 41 chunks, 37.6 MB) was 1.04-1.12x vLLM's own hit in five runs on an H200, its
engine phase 1.5-2 ms longer, where the same engine without the capture was not
(``benchmarks/results/gpu-native-path-2026-11-26c/`` at commit 3d85877; ``benchmarks/HISTORY.md``).

:class:`StoresAfterOutputs` wraps the worker vLLM's spec builds and submits each store once a
later step has begun: with a batch queue of two, vLLM schedules that step only after it has
taken the earlier step's output. Loads are never held. A store that vLLM must wait for (a
block about to be reused) is submitted before the wait.
"""

from __future__ import annotations

from typing import Any

from vllm.v1.kv_offload.base import OffloadingWorker, TransferResult

_Job = tuple[int, Any, Any]


class StoresAfterOutputs(OffloadingWorker):
    """vLLM's ``OffloadingWorker`` with stores held until the engine's next step.

    vLLM calls ``get_finished`` once per step, after that step's submits; a store submitted
    in step ``s`` is passed on at the first call in step ``s + 1`` (a submit, or that step's
    ``get_finished``). The engine keeps stepping while a store is pending, so a held store
    always goes out."""

    def __init__(self, inner: OffloadingWorker) -> None:
        self._inner = inner
        self._held: list[_Job] = []  # submitted in this step
        self._due: list[_Job] = []  # submitted in an earlier step: pass on now

    def submit_store(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        self._pass_on(self._due)
        self._held.append((job_id, src_spec, dst_spec))
        return True

    def submit_load(self, job_id: int, src_spec: Any, dst_spec: Any) -> bool:
        self._pass_on(self._due)
        return self._inner.submit_load(job_id, src_spec, dst_spec)

    def get_finished(self) -> list[TransferResult]:
        self._pass_on(self._due)
        self._due, self._held = self._held, []
        return self._inner.get_finished()

    def wait(self, job_ids: set[int]) -> None:
        self._pass_on(self._due)
        self._pass_on(self._held)
        self._inner.wait(job_ids)

    def shutdown(self) -> None:
        try:
            self._pass_on(self._due)
            self._pass_on(self._held)
        finally:
            self._inner.shutdown()

    def _pass_on(self, jobs: list[_Job]) -> None:
        while jobs:
            job_id, src_spec, dst_spec = jobs.pop(0)
            # vLLM asserts every submit succeeds; a refused store would leave its job
            # pending forever, so it fails as loudly here
            if not self._inner.submit_store(job_id, src_spec, dst_spec):
                raise RuntimeError(f"vLLM's offloading worker refused store job {job_id}")
