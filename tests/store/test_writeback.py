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


def test_write_behind_drops_over_budget_but_memory_keeps_it(tmp_path, caplog):
    disk = DiskStore(tmp_path, 1 << 20)
    writer = WriteBehind(disk, max_pending_bytes=10)  # smaller than one chunk
    assert not writer.submit(K1, chunk(1))
    assert writer.dropped == 1 and "queue full" in caplog.text
    writer.close()
    tiered = TieredStore(MemoryStore(1 << 20), DiskStore(tmp_path / "b", 1 << 20),
                         write_behind_bytes=10)
    assert tiered.put(K2, chunk(2))  # kept in memory
    tiered.flush()
    assert not tiered.disk.contains(K2)
    tiered.close()


def test_write_behind_survives_a_failing_write(tmp_path, monkeypatch):
    disk = DiskStore(tmp_path, 1 << 20)
    calls = []

    def broken_put(key, tensors):
        calls.append(key)
        raise RuntimeError("boom")

    monkeypatch.setattr(disk, "put", broken_put)
    writer = WriteBehind(disk, 1 << 20)
    writer.submit(K1, chunk(1))
    writer.submit(K2, chunk(2))
    writer.flush()
    assert calls == [K1, K2]
    writer.close()


def test_ensure_in_memory_verifies_disk_chunks(tmp_path):
    disk = DiskStore(tmp_path, 1 << 20)
    disk.put(K1, chunk(1))
    disk.put(K2, chunk(2))
    path = disk.path_for(K2)
    data = bytearray(path.read_bytes())
    data[-1] ^= 0xFF
    path.write_bytes(bytes(data))
    tiered = TieredStore(MemoryStore(1 << 20), DiskStore(tmp_path, 1 << 20))
    assert tiered.ensure_in_memory(K1) and tiered.memory.contains(K1)
    assert not tiered.ensure_in_memory(K2) and not path.exists()
    assert not tiered.ensure_in_memory(K3)
