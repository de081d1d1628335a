"""Reading a one-tensor uint8 chunk straight into a caller's buffer (the KV tier's rows)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch
import torch

from vlmcache.store import DiskStore

KEY, OTHER = "ab" * 32, "cd" * 32


def stored(root: Path, payload: np.ndarray, key: str = KEY) -> DiskStore:
    store = DiskStore(root, 10**9)
    assert store.put(key, {"kv": torch.from_numpy(payload)}, tenant="acme")
    return store


def test_reads_the_exact_bytes_into_the_buffer_and_counts_a_hit(tmp_path):
    payload = np.random.default_rng(1).integers(0, 256, 70_001, dtype=np.uint8)
    store = stored(tmp_path, payload)
    out = np.zeros(70_001, dtype=np.uint8)
    assert store.get_into(KEY, "kv", memoryview(out))
    assert np.array_equal(out, payload)
    assert store.stats().hits == 1 and store.stats().bytes_read == 70_001


def test_a_file_get_into_writes_is_also_a_chunk_get_reads(tmp_path):
    payload = np.arange(4096, dtype=np.uint8)
    store = stored(tmp_path, payload)
    assert np.array_equal(store.get(KEY)["kv"].numpy(), payload)  # same format both ways


@pytest.mark.parametrize("damage", ["flip", "truncate", "pad"])
def test_a_damaged_file_is_a_miss_and_is_deleted(tmp_path, damage):
    payload = np.full(8192, 7, dtype=np.uint8)
    store = stored(tmp_path, payload)
    path = store.path_for(KEY)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[-100] ^= 0xFF
    elif damage == "truncate":
        data = data[:-10]
    else:
        data += b"\0" * 16
    path.write_bytes(bytes(data))
    out = np.zeros(8192, dtype=np.uint8)
    assert not store.get_into(KEY, "kv", memoryview(out))
    assert not path.exists() and store.stats().errors == 1


def test_a_file_renamed_to_another_key_is_refused(tmp_path):
    store = stored(tmp_path, np.ones(512, dtype=np.uint8))
    other = store.path_for(OTHER)
    other.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    shutil.copy(store.path_for(KEY), other)
    assert not store.get_into(OTHER, "kv", memoryview(np.zeros(512, dtype=np.uint8)))


@pytest.mark.parametrize("tensors", [
    {"kv": torch.ones(512, dtype=torch.float16)},  # not bytes
    {"kv": torch.ones(256, dtype=torch.uint8)},  # another size than the row
    {"kv": torch.ones(512, dtype=torch.uint8), "x": torch.ones(1, dtype=torch.uint8)},
    {"other": torch.ones(512, dtype=torch.uint8)},
])
def test_a_chunk_of_another_shape_is_refused(tmp_path, tensors):
    store = DiskStore(tmp_path, 10**9)
    assert store.put(KEY, tensors)
    assert not store.get_into(KEY, "kv", memoryview(np.zeros(512, dtype=np.uint8)))


def test_a_missing_key_is_a_plain_miss(tmp_path):
    store = DiskStore(tmp_path, 10**9)
    assert not store.get_into(KEY, "kv", memoryview(np.zeros(8, dtype=np.uint8)))
    assert store.stats().misses == 1 and store.stats().errors == 0


def test_a_chunk_is_a_plain_safetensors_file_with_its_metadata(tmp_path):
    """Other tools can read a chunk (its key and tenant are in the metadata)."""
    store = stored(tmp_path, np.arange(100, dtype=np.uint8))
    header = safetensors.safe_open(str(store.path_for(KEY)), "pt").metadata()
    assert header["key"] == KEY and header["tenant"] == "acme"
