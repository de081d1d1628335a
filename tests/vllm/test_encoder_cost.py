"""The encoder-output tier's load-versus-encode decision."""

from vlmcache.keys import image_uuid
from vlmcache.vllm.cost import CostModel, CostPriors
from vlmcache.vllm.encoder_cost import EncoderGate
from vlmcache.vllm.encoder_plan import EncoderLoad, EncoderPlanner

A = image_uuid("", "tenant-a", "a" * 64)
MB = 1_000_000


def _gate(where, read_bytes_per_s=1e9, embeds_per_s=80_000.0, per_embed=8192, enabled=True):
    cost = CostModel(CostPriors(read_bytes_per_s, 0.0, embeds_per_s), enabled=enabled)
    return EncoderGate(cost, lambda key: where.get(key), per_embed)


def _planner(where, reads, **kw):
    gate = _gate(where, **kw)

    def available(key):
        reads.append(key)
        return key in where

    return EncoderPlanner("ns", available, gate=gate), gate


def test_an_output_in_memory_is_always_loaded():
    key = EncoderPlanner("ns", lambda k: True).key(A)
    reads = []
    planner, gate = _planner({key: ("memory", 300 * MB)}, reads, read_bytes_per_s=1.0)
    assert planner.has(A) and reads == [key] and gate.skipped == 0
    assert gate.cost.reads_observed == 0  # a memory copy says nothing about the disk


def test_a_disk_output_is_read_only_when_the_read_beats_encoding():
    key = EncoderPlanner("ns", lambda k: True).key(A)
    # 4.7 MB (576 embeds of 8 KiB): 4.7 ms to read at 1 GB/s < 7.2 ms to encode at 80k/s
    reads = []
    planner, gate = _planner({key: ("disk", 576 * 8192)}, reads)
    assert planner.has(A) and reads == [key] and gate.skipped == 0
    assert gate.cost.reads_observed == 0  # the scheduler reads nothing: workers report
    # a video's 300 MB at 100 MB/s (3 s) against 36,600 embeds encoded in 0.46 s
    reads = []
    planner, gate = _planner({key: ("disk", 300 * MB)}, reads, read_bytes_per_s=100e6)
    assert not planner.has(A) and reads == [] and gate.skipped == 1


def test_an_absent_output_is_a_miss_without_a_decision():
    reads = []
    planner, gate = _planner({}, reads)
    assert not planner.has(A) and gate.skipped == 0


def test_with_the_cost_model_off_every_stored_output_is_loaded():
    key = EncoderPlanner("ns", lambda k: True).key(A)
    reads = []
    planner, gate = _planner({key: ("disk", 300 * MB)}, reads, read_bytes_per_s=100e6,
                             enabled=False)
    assert planner.has(A) and reads == [key]


def test_the_workers_timed_reads_set_the_gates_rate(tmp_path):
    """The scheduler promises from the index; the worker reads, verifies and times it, and
    the scheduler's gate learns the disk's rate from that report."""
    import torch

    from vlmcache.store import DiskStore, MemoryStore, TieredStore
    from vlmcache.vllm.encoder_plan import TENSOR_NAME, EncoderTransfer

    store = TieredStore(MemoryStore(1 << 24), DiskStore(tmp_path, 1 << 26))
    key = EncoderPlanner("ns", lambda k: True).key(A)
    store.put(key, {TENSOR_NAME: torch.randn(576, 2048)})  # 4.7 MB
    store.flush()
    store.memory.delete(key)  # on disk only: this read is timed
    transfer = EncoderTransfer(store, "ns", "cpu")
    gate = _gate({key: store.locate(key)}, read_bytes_per_s=1.0, embeds_per_s=10_000.0,
                 per_embed=2048 * 4)  # 576 embeds: 58 ms to encode
    planner = EncoderPlanner("ns", store.contains, gate=gate)
    assert not planner.has(A)  # at 1 B/s the prior says encode
    transfer.load((EncoderLoad(A, key, 576, "r1", 0),), {})
    reads = transfer.take_reads()
    assert len(reads) == 1 and reads[0][0] >= 576 * 2048 * 4 and reads[0][1] > 0
    assert transfer.take_reads() == ()
    transfer.load((EncoderLoad(A, key, 576, "r1", 0),), {})  # now in memory: not timed
    assert transfer.take_reads() == ()
    planner.observe_reads(reads)
    assert gate.cost.reads_observed == 1 and planner.has(A)  # the disk is fast after all
