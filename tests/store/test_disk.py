"""Tests for the on-disk, crash-safe chunk store."""

from __future__ import annotations

import errno
import json
import logging
import os
import threading
import time
from pathlib import Path
from typing import Any, BinaryIO

import pytest
import torch
from safetensors import safe_open

import vlmcache.store.chunkfile as chunkfile_mod
from vlmcache.store import ChunkStore, DiskStore, chunk_checksum

A, B, C, D = "aa01", "bb02", "cc03", "dd04"
DEAD_PID = 4194305  # above the largest possible Linux pid_max


def chunk(value: float, numel: int = 25) -> dict[str, torch.Tensor]:
    """A one-tensor float32 chunk (100 B by default)."""
    return {"kv": torch.full((numel,), value, dtype=torch.float32)}


def files_under(root: Path) -> list[str]:
    return sorted(p.name for p in (root / "chunks").rglob("*") if p.is_file())


def assert_faulty_read(store: DiskStore, key: str, caplog: pytest.LogCaptureFixture) -> None:
    """get() must log a warning naming the key, delete the file, count an error and a miss."""
    before = store.stats()
    with caplog.at_level(logging.WARNING, logger="vlmcache.store.disk"):
        assert store.get(key) is None
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any(key in msg for msg in warnings), warnings
    assert not store.path_for(key).exists()
    assert not store.contains(key)
    after = store.stats()
    assert after.errors == before.errors + 1 and after.misses == before.misses + 1
    assert after.entries == before.entries - 1
    assert after.occupancy_bytes == before.occupancy_bytes - 100


def test_implements_protocol(tmp_path: Path) -> None:
    assert isinstance(DiskStore(tmp_path, 100), ChunkStore)


def test_roundtrip_dtypes_layout_and_header(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, 10_000)
    src = {
        "bf16": torch.randn(2, 3).to(torch.bfloat16),
        "f16": torch.randn(4).to(torch.float16),
        "i64": torch.arange(6, dtype=torch.int64).reshape(3, 2),
        "i8": torch.tensor([-3, 0, 7], dtype=torch.int8),
    }
    assert store.put(A, src)
    path = tmp_path / "chunks" / "aa" / f"{A}.safetensors"
    assert store.path_for(A) == path and path.is_file()
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    assert meta == {"vlmcache_format": "1", "key": A, "sha256": chunk_checksum(src)}
    out = store.get(A)
    assert out is not None and out.keys() == src.keys()
    for name, tensor in src.items():
        assert out[name].dtype == tensor.dtype and torch.equal(out[name], tensor)


def test_checksum_folds_in_names_dtypes_and_shapes() -> None:
    raw = torch.arange(8, dtype=torch.int32)
    base = chunk_checksum({"x": raw})
    assert base == chunk_checksum({"x": raw.clone()})
    assert base != chunk_checksum({"y": raw})
    assert base != chunk_checksum({"x": raw.reshape(2, 4)})
    assert base != chunk_checksum({"x": raw.view(torch.float32)})
    assert chunk_checksum({"a": raw, "b": raw + 1}) != chunk_checksum({"a": raw + 1, "b": raw})


def test_lru_budget_stats_and_on_evict(tmp_path: Path) -> None:
    evicted: list[str] = []
    store = DiskStore(tmp_path, 300, on_evict=evicted.append)
    for i, key in enumerate([A, B, C]):
        assert store.put(key, chunk(i))
    assert store.get(A) is not None
    assert store.put(D, chunk(3))
    assert evicted == [B] and not store.path_for(B).exists()
    assert store.keys() == [C, A, D]
    assert store.get(B) is None
    assert store.delete(C) and not store.delete(C)
    assert evicted == [B]  # delete does not notify
    stats = store.stats()
    assert (stats.hits, stats.misses, stats.evictions, stats.errors) == (1, 1, 1, 0)
    assert stats.entries == 2 and stats.occupancy_bytes == 200
    assert stats.bytes_written == 400 and stats.bytes_read == 100
    assert files_under(tmp_path) == [f"{A}.safetensors", f"{D}.safetensors"]


def test_oversized_chunk_rejected(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, 150)
    assert store.put(A, chunk(0))
    assert not store.put(B, chunk(1, numel=50))
    assert store.keys() == [A] and files_under(tmp_path) == [f"{A}.safetensors"]
    assert store.stats().evictions == 0


def test_corrupted_payload_byte(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = DiskStore(tmp_path, 1000)
    store.put(A, chunk(1.5))
    store.put(B, chunk(2.5))
    data = bytearray(store.path_for(A).read_bytes())
    data[-3] ^= 0xFF  # inside the tensor payload
    store.path_for(A).write_bytes(bytes(data))
    assert_faulty_read(store, A, caplog)
    assert any("checksum" in r.getMessage() for r in caplog.records)
    assert store.get(B) is not None  # neighbours unaffected


def test_truncated_file(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = DiskStore(tmp_path, 1000)
    store.put(A, chunk(1.5))
    data = store.path_for(A).read_bytes()
    store.path_for(A).write_bytes(data[: len(data) - 40])
    assert_faulty_read(store, A, caplog)


def test_garbage_header(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = DiskStore(tmp_path, 1000)
    store.put(A, chunk(1.5))
    data = bytearray(store.path_for(A).read_bytes())
    data[8:20] = b"#garbage!{}["
    store.path_for(A).write_bytes(bytes(data))
    assert_faulty_read(store, A, caplog)


def test_file_of_another_key_rejected(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = DiskStore(tmp_path, 1000)
    store.put(A, chunk(1.5))
    store.put("aa02", chunk(2.5))
    os.replace(store.path_for("aa02"), store.path_for(A))
    assert_faulty_read(store, A, caplog)


def test_missing_key_is_a_plain_miss(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = DiskStore(tmp_path, 1000)
    with caplog.at_level(logging.WARNING):
        assert store.get(A) is None
    assert not caplog.records
    assert (store.stats().misses, store.stats().errors) == (1, 0)


def test_manifest_survives_reopen_with_lru_order(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, 1000)
    for i, key in enumerate([A, B, C]):
        store.put(key, chunk(i))
    store.get(A)
    store.close()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["format"] == 1 and set(manifest["entries"]) == {A, B, C}
    assert manifest["entries"][B]["bytes"] == 100
    assert manifest["entries"][B]["sha256"] == chunk_checksum(chunk(1))
    reopened = DiskStore(tmp_path, 1000)
    assert reopened.keys() == [B, C, A]
    assert reopened.stats().occupancy_bytes == 300 and reopened.stats().entries == 3
    out = reopened.get(C)
    assert out is not None and torch.equal(out["kv"], chunk(2)["kv"])


def test_manifest_written_every_n_puts(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, 1000, manifest_every=2)
    store.put(A, chunk(0))
    assert not (tmp_path / "manifest.json").exists()
    store.put(B, chunk(1))
    assert set(json.loads((tmp_path / "manifest.json").read_text())["entries"]) == {A, B}


def test_reopen_with_smaller_capacity_evicts_lru(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, 1000)
    for i, key in enumerate([A, B, C]):
        store.put(key, chunk(i))
    store.close()
    evicted: list[str] = []
    small = DiskStore(tmp_path, 200, on_evict=evicted.append)
    assert evicted == [A] and small.keys() == [B, C] and not small.path_for(A).exists()


def test_recovery_without_manifest(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, 1000)  # crash: close() never called
    store.put(A, chunk(0))
    store.put(B, chunk(1))
    assert not (tmp_path / "manifest.json").exists()
    reopened = DiskStore(tmp_path, 1000)
    assert set(reopened.keys()) == {A, B}
    assert reopened.stats().occupancy_bytes == 200
    out = reopened.get(B)
    assert out is not None and torch.equal(out["kv"], chunk(1)["kv"])


def test_recovery_with_stale_manifest(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, 1000)
    store.put(A, chunk(0))
    store.close()
    store.put(B, chunk(1))  # not in the manifest
    reopened = DiskStore(tmp_path, 1000)
    assert set(reopened.keys()) == {A, B}
    assert reopened.get(A) is not None and reopened.get(B) is not None


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"format": 99, "entries": {}}'])
def test_recovery_with_unusable_manifest(tmp_path: Path, text: str) -> None:
    store = DiskStore(tmp_path, 1000)
    store.put(A, chunk(0))
    store.put(B, chunk(1))
    store.close()
    (tmp_path / "manifest.json").write_text(text)
    reopened = DiskStore(tmp_path, 1000)
    assert set(reopened.keys()) == {A, B}
    assert reopened.get(A) is not None and reopened.get(B) is not None


def test_recovery_drops_entries_whose_file_is_gone(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, 1000)
    store.put(A, chunk(0))
    store.put(B, chunk(1))
    store.close()
    os.unlink(store.path_for(A))
    reopened = DiskStore(tmp_path, 1000)
    assert reopened.keys() == [B]
    assert reopened.stats().occupancy_bytes == 100
    assert not reopened.contains(A)


def test_recovery_removes_stale_temp_files(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, 1000)
    store.put(A, chunk(0))
    shard = store.path_for(A).parent
    dead = shard / f".{A}.{DEAD_PID}.0123abcd.tmp"
    old = shard / f".{B}.{os.getpid()}.0123abce.tmp"
    fresh = shard / f".{C}.{os.getpid()}.0123abcf.tmp"
    dead_manifest = tmp_path / f".manifest.{DEAD_PID}.00ff.tmp"
    for path in (dead, old, fresh, dead_manifest):
        path.write_bytes(b"partial")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    reopened = DiskStore(tmp_path, 1000)
    assert not dead.exists() and not old.exists() and not dead_manifest.exists()
    assert fresh.exists()  # a live writer's temp file is left alone
    assert reopened.keys() == [A]


def test_chunk_written_by_another_instance_is_visible(tmp_path: Path) -> None:
    first = DiskStore(tmp_path, 1000)
    second = DiskStore(tmp_path, 1000)
    assert not first.contains(A)
    assert second.put(A, chunk(7))
    assert first.contains(A)
    assert first.keys() == []  # contains has no side effects
    out = first.get(A)
    assert out is not None and torch.equal(out["kv"], chunk(7)["kv"])
    assert first.keys() == [A] and first.stats().occupancy_bytes == 100
    assert first.stats().hits == 1


def test_chunk_rewritten_by_another_instance_stays_readable(tmp_path: Path) -> None:
    first = DiskStore(tmp_path, 1000)
    second = DiskStore(tmp_path, 1000)
    first.put(A, chunk(1))
    second.put(A, chunk(2))  # same key, different bytes
    out = first.get(A)
    assert out is not None and torch.equal(out["kv"], chunk(2)["kv"])
    assert first.stats().errors == 0 and first.path_for(A).exists()


def test_disk_full_leaves_no_partial_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    store = DiskStore(tmp_path, 10_000)
    assert store.put(A, chunk(1))

    def full(f: BinaryIO, data: bytes) -> None:
        f.write(data[: len(data) // 2])
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(chunkfile_mod, "_write_bytes", full)
    with caplog.at_level(logging.WARNING, logger="vlmcache.store.disk"):
        assert not store.put(B, chunk(2))
        assert not store.put(A, chunk(3))  # a failed rewrite keeps the old chunk
    assert any(B in r.getMessage() for r in caplog.records)
    assert files_under(tmp_path) == [f"{A}.safetensors"]
    assert not store.contains(B)
    stats = store.stats()
    assert stats.errors == 2 and stats.entries == 1 and stats.occupancy_bytes == 100
    monkeypatch.undo()
    out = store.get(A)
    assert out is not None and torch.equal(out["kv"], chunk(1)["kv"])


@pytest.mark.parametrize(
    "key", ["ABCD", "ab-cd", "a", "", "../etc", "ab\n", "g" * 4, "a" * 129, 123]
)
def test_invalid_key_raises(tmp_path: Path, key: Any) -> None:
    store = DiskStore(tmp_path, 1000)
    with pytest.raises(ValueError, match="chunk key"):
        store.put(key, chunk(0))
    with pytest.raises(ValueError, match="chunk key"):
        store.get(key)
    with pytest.raises(ValueError, match="chunk key"):
        store.contains(key)
    with pytest.raises(ValueError, match="chunk key"):
        store.delete(key)
    assert files_under(tmp_path) == []


def test_thread_safety_smoke(tmp_path: Path) -> None:
    store = DiskStore(tmp_path, 64 * 6, manifest_every=5)
    bad: list[str] = []
    gets = [0]
    count_lock = threading.Lock()

    def worker(tid: int) -> None:
        for i in range(30):
            key = f"{(tid * 5 + i) % 10:02x}"
            if i % 2 == 0:
                store.put(key, {"kv": torch.full((16,), int(key, 16), dtype=torch.float32)})
            else:
                out = store.get(key)
                with count_lock:
                    gets[0] += 1
                expected = torch.full((16,), float(int(key, 16)))
                if out is not None and not torch.equal(out["kv"], expected):
                    bad.append(key)

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    stats = store.stats()
    assert not bad and stats.errors == 0
    assert stats.hits + stats.misses == gets[0]
    assert stats.occupancy_bytes == 64 * stats.entries <= stats.capacity_bytes
    assert sorted(store.keys()) == sorted(n.split(".")[0] for n in files_under(tmp_path))
