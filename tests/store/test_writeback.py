import torch

from vlmcache.store.disk import DiskStore
from vlmcache.store.memory import MemoryStore
from vlmcache.store.tiered import TieredStore
from vlmcache.store.writeback import WriteBehind

K1, K2, K3 = "11" * 32, "22" * 32, "33" * 32


def chunk(value, n=16):
    return {"layer": torch.full((n,), float(value))}


def test_write_behind_reaches_disk_after_flush(tmp_path):
    disk = DiskStore(tmp_path, 1 << 20)
    tiered = TieredStore(MemoryStore(1 << 20), disk, write_behind_bytes=1 << 20)
    assert tiered.put(K1, chunk(1))
    tiered.flush()
    other = DiskStore(tmp_path, 1 << 20)  # another process's view
    assert torch.equal(other.get(K1)["layer"], chunk(1)["layer"])
    tiered.close()


def test_write_behind_drops_over_budget(tmp_path, caplog):
    disk = DiskStore(tmp_path, 1 << 20)
    writer = WriteBehind(disk, max_pending_bytes=10)  # smaller than one chunk
    assert not writer.submit(K1, chunk(1))
    assert writer.dropped == 1 and "queue full" in caplog.text
    writer.close()


def test_write_behind_survives_a_failing_write(tmp_path, monkeypatch):
    disk = DiskStore(tmp_path, 1 << 20)
    calls = []

    def broken_put(key, tensors, tenant=None):
        calls.append(key)
        raise RuntimeError("boom")

    monkeypatch.setattr(disk, "put", broken_put)
    writer = WriteBehind(disk, 1 << 20)
    writer.submit(K1, chunk(1))
    writer.submit(K2, chunk(2))
    writer.flush()
    assert calls == [K1, K2]
    writer.close()


def test_a_tiered_read_verifies_disk_chunks(tmp_path):
    disk = DiskStore(tmp_path, 1 << 20)
    disk.put(K1, chunk(1))
    disk.put(K2, chunk(2))
    path = disk.path_for(K2)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    tiered = TieredStore(MemoryStore(1 << 20), DiskStore(tmp_path, 1 << 20))
    assert tiered.get(K1) is not None and tiered.memory.contains(K1)
    assert tiered.get(K2) is None and not path.exists()
    assert tiered.get(K3) is None


def test_drops_are_counted_and_logged_at_most_once_per_interval(tmp_path, caplog):
    writer = WriteBehind(DiskStore(tmp_path, 1 << 20), max_pending_bytes=10)
    with caplog.at_level("WARNING", logger="vlmcache.store.writeback"):
        for i in range(1000):
            assert not writer.submit(f"{i:04x}", chunk(i))
    lines = [r for r in caplog.records if "queue full" in r.getMessage()]
    assert len(lines) == 1  # was one line per dropped chunk
    stats = writer.stats()
    assert stats.dropped == 1000 and stats.lost == 0
    writer.close()


def test_a_full_queue_makes_the_tiered_put_write_through(tmp_path):
    """Issue 33 item 7: a put past the queue was acknowledged (memory kept it) but never
    written, so a crash lost up to 10x the queue; now it is written before put returns."""
    disk = DiskStore(tmp_path, 1 << 20)
    tiered = TieredStore(MemoryStore(1 << 20), disk, write_behind_bytes=10)
    for i in range(100):
        assert tiered.put(f"{i:04x}", chunk(i))
    assert all(disk.contains(f"{i:04x}") for i in range(100))  # no flush needed
    assert tiered.stats().writes_dropped == 0
    tiered.close()


def test_acknowledged_writes_that_fail_are_counted_as_lost(tmp_path, caplog):
    disk = DiskStore(tmp_path, 1 << 20)
    disk.put = lambda key, tensors: False  # e.g. ENOSPC after the put was acknowledged
    tiered = TieredStore(MemoryStore(1 << 20), disk, write_behind_bytes=1 << 20)
    with caplog.at_level("WARNING", logger="vlmcache.store.writeback"):
        for i in range(50):
            assert tiered.put(f"{i:04x}", chunk(i))
        tiered.flush()
    assert tiered.stats().writes_lost == 50
    assert tiered.writer.stats().pending_chunks == 0 and tiered.writer.stats().written == 0
    assert sum("acknowledged but not written" in r.getMessage() for r in caplog.records) == 1
    tiered.close()


def test_pending_bytes_bound_what_a_crash_can_lose(tmp_path):
    disk = DiskStore(tmp_path, 1 << 20)
    gate = __import__("threading").Event()
    real_put = disk.put
    disk.put = lambda key, tensors, tenant=None: gate.wait() and real_put(key, tensors)
    writer = WriteBehind(disk, max_pending_bytes=64 * 3)  # three 64-byte chunks
    accepted = sum(writer.submit(f"{i:04x}", chunk(i)) for i in range(10))
    stats = writer.stats()
    assert accepted == 3 and stats.pending_bytes <= stats.max_pending_bytes == 192
    assert stats.pending_chunks == 3 and stats.dropped == 7
    gate.set()
    writer.close()
    assert writer.stats().written == 3 and writer.stats().pending_bytes == 0
