"""The shared occupancy counter follows the files actually removed (issue 33, item 5).

Two stores on one root each index the chunks they wrote or read. When one rewrites a chunk
at another size, the other's index entry is stale; evicting or deleting the chunk must
subtract the size of the file it removes, not the stale one, or the root's counter drifts
(it read 100,000 B with 106,000 B on disk) and the shared budget no longer holds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from vlmcache.store import DiskStore
from vlmcache.store.chunkfile import file_entry

K0, K1 = "aa00", "bb01"


def chunk(nbytes: int, value: float = 1.0) -> dict[str, torch.Tensor]:
    return {"kv": torch.full((nbytes // 4,), value, dtype=torch.float32)}


def on_disk_payload(root: Path) -> int:
    return sum(file_entry(p, p.name.split(".")[0])[0]
               for p in (root / "chunks").rglob("*.safetensors"))


@pytest.mark.parametrize(("rewritten", "budget"), [(1000, 1500), (40, 650)])  # grown, shrunk
def test_eviction_subtracts_the_size_of_the_file_it_removes(tmp_path: Path, rewritten: int,
                                                            budget: int) -> None:
    a, b = DiskStore(tmp_path, budget), DiskStore(tmp_path, budget)
    assert a.put(K0, chunk(100))
    assert b.put(K0, chunk(rewritten, 2.0))  # a's entry for K0 still says 100 B
    assert b.shared_occupancy() == rewritten == on_disk_payload(tmp_path)
    assert a.put(K1, chunk(600))  # over the budget: evicts K0, a's least recently used
    assert not a.path_for(K0).exists()
    assert a.shared_occupancy() == 600 == on_disk_payload(tmp_path)


def test_delete_subtracts_the_size_of_the_file_it_removes(tmp_path: Path) -> None:
    a, b = DiskStore(tmp_path, 10_000), DiskStore(tmp_path, 10_000)
    assert a.put(K0, chunk(100)) and a.put(K1, chunk(200))
    assert b.put(K0, chunk(1000, 2.0))
    assert a.delete(K0)
    assert a.shared_occupancy() == 200 == on_disk_payload(tmp_path)


def test_a_fault_found_after_a_rewrite_subtracts_the_rewritten_size(tmp_path: Path) -> None:
    a, b = DiskStore(tmp_path, 10_000), DiskStore(tmp_path, 10_000)
    assert a.put(K0, chunk(100)) and a.put(K1, chunk(200))
    assert b.put(K0, chunk(1000, 2.0))
    path = a.path_for(K0)
    raw = bytearray(path.read_bytes())
    raw[-1] ^= 0xFF  # one payload bit: the header (and so its size) still reads
    path.write_bytes(bytes(raw))
    assert a.get(K0) is None and not path.exists()
    assert a.shared_occupancy() == 200 == on_disk_payload(tmp_path)
