"""The CPU-platform worker of vLLM's tiering offloader, and the spec's memory budget.

No engine: vLLM's own region and spec classes with small fake KV tensors.
"""

from __future__ import annotations

import uuid

import pytest
import torch

pytest.importorskip("vllm.v1.kv_offload.tiering.spec")

from vllm.v1.kv_offload.base import (  # noqa: E402
    CanonicalKVCacheRef,
    CanonicalKVCaches,
    CanonicalKVCacheTensor,
    GPULoadStoreSpec,
)
from vllm.v1.kv_offload.cpu.common import CPULoadStoreSpec  # noqa: E402
from vllm.v1.kv_offload.cpu.shared_offload_region import SharedOffloadRegion  # noqa: E402

from vlmcache.vllm.cpu_worker import CPUCopyWorker  # noqa: E402

PAGE = 4096          # bytes of one layer's KV block on one rank
NUM_BLOCKS = 16
NUM_CHUNKS = 8
WORLD = 2


def kv_caches(fill: int) -> tuple[CanonicalKVCaches, torch.Tensor]:
    kv = torch.full((NUM_BLOCKS, PAGE), fill, dtype=torch.int8)
    caches = CanonicalKVCaches(tensors=[CanonicalKVCacheTensor(kv, PAGE)],
                               group_data_refs=[[CanonicalKVCacheRef(0, PAGE)]])
    return caches, kv


def region(engine: str, rank: int | None, bpc: int = 1) -> SharedOffloadRegion:
    return SharedOffloadRegion(engine_id=engine, num_chunks=NUM_CHUNKS, rank=rank,
                               kv_bytes_per_chunk=PAGE * bpc * WORLD, cpu_page_size=PAGE * bpc)


def gpu(blocks, first=0) -> GPULoadStoreSpec:
    return GPULoadStoreSpec(list(blocks), group_sizes=[len(blocks)], block_indices=[first])


@pytest.fixture
def engine():
    return f"vlmcache-test-{uuid.uuid4().hex[:8]}"


def test_two_tp_ranks_share_a_row_and_never_load_each_others_shard(engine):
    sched = region(engine, None)  # the scheduler side (where the persistent tier reads rows)
    caches0, kv0 = kv_caches(1)
    caches1, kv1 = kv_caches(2)
    w0 = CPUCopyWorker(caches0, 1, region(engine, 0))
    w1 = CPUCopyWorker(caches1, 1, region(engine, 1))
    assert w0.submit_store(1, gpu([3, 4]), CPULoadStoreSpec([5, 6]))
    assert w1.submit_store(2, gpu([3, 4]), CPULoadStoreSpec([5, 6]))
    row = sched.base_tensor.view(NUM_CHUNKS, -1)[5]
    assert (row[:PAGE] == 1).all() and (row[PAGE:2 * PAGE] == 2).all()  # rank order

    kv0.zero_()
    kv1.zero_()
    w0.submit_load(3, CPULoadStoreSpec([5, 6]), gpu([9, 10]))
    w1.submit_load(4, CPULoadStoreSpec([5, 6]), gpu([9, 10]))
    assert (kv0[9:11] == 1).all() and (kv1[9:11] == 2).all()
    assert not kv0[:9].any() and not kv1[11:].any()
    done = {r.job_id: (r.success, r.transfer_size) for r in w0.get_finished()}
    assert done == {1: (True, 2 * PAGE), 3: (True, 2 * PAGE)}
    for w in (w0, w1):
        w.shutdown()
    sched.cleanup()


def test_chunks_of_several_blocks_with_an_unaligned_first_block(engine):
    caches, kv = kv_caches(0)
    for b in range(NUM_BLOCKS):
        kv[b] = b
    w = CPUCopyWorker(caches, 4, region(engine, 0, bpc=4))
    # blocks 2..6 of a request (logical index 2 starts in the middle of chunk 0)
    w.submit_store(1, gpu([10, 11, 12, 13, 14], first=2), CPULoadStoreSpec([3, 4]))
    kv.zero_()
    w.submit_load(2, CPULoadStoreSpec([3, 4]), gpu([0, 1, 2, 3, 4], first=2))
    assert [int(kv[b, 0]) for b in range(5)] == [10, 11, 12, 13, 14]
    w.shutdown()


def test_spec_memory_tier_never_exceeds_memory_budget():
    from vllm.v1.kv_offload.config import (
        OffloadingCacheConfig,
        OffloadingConfig,
        OffloadingGroupConfig,
        OffloadingModelConfig,
        OffloadingParallelConfig,
    )

    from vlmcache.vllm.engine_config import kv_extra_config
    from vlmcache.vllm.offload_spec import VlmCacheOffloadingSpec, release_runtime
    from vlmcache.config import VlmCacheConfig

    budget = 10 * 1024**2 + 12345
    extra = kv_extra_config(VlmCacheConfig(memory_budget=budget, disk_budget=0))
    parallel = OffloadingParallelConfig(rank=0, world_size=2, tp_size=2, pp_size=1, pcp_size=1,
                                        dcp_size=1, data_parallel_index=0, data_parallel_size=1,
                                        data_parallel_rank_local=None,
                                        is_parallelism_agnostic=False)
    config = OffloadingConfig(
        groups=(OffloadingGroupConfig(32, ("layer.0",), 0),), worker_kv_bytes_per_block=3 * PAGE,
        enable_kv_cache_events=False, extra_config=extra, engine_id="budget-test",
        model=OffloadingModelConfig("m", "float16"), cache=OffloadingCacheConfig(32, 1),
        parallel=parallel)
    spec = VlmCacheOffloadingSpec(config)
    try:
        assert spec.num_chunks > 0
        assert spec.num_chunks * spec.kv_bytes_per_chunk <= budget
        assert spec.kv_bytes_per_chunk >= 2 * 3 * PAGE  # a row holds every TP rank's block
        assert spec.tokens_per_chunk == 32
    finally:
        release_runtime("budget-test")
