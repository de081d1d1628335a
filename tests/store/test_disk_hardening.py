"""Defects found by trials from outside (issue 14): sizes from files, a per-directory budget
across processes, private files and dirs, no planted-symlink following."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import torch

from vlmcache.store import DiskStore
from vlmcache.store.chunkfile import file_entry

KEYS = [f"{i:04x}" for i in range(30)]


def chunk(value: float, numel: int = 25) -> dict[str, torch.Tensor]:
    return {"kv": torch.full((numel,), value, dtype=torch.float32)}  # 100 B


def filled(root: Path, n: int = 30) -> DiskStore:
    store = DiskStore(root, 10_000)
    for i, key in enumerate(KEYS[:n]):
        assert store.put(key, chunk(i))
    store.close()
    return store


def on_disk_payload(root: Path) -> int:
    total = 0
    for path in (root / "chunks").rglob("*.safetensors"):
        total += file_entry(path, path.name.split(".")[0])[0]
    return total


def edit_manifest(root: Path, bytes_of: dict[str, int]) -> None:
    manifest = json.loads((root / "manifest.json").read_text())
    for key, value in bytes_of.items():
        manifest["entries"][key]["bytes"] = value
    (root / "manifest.json").write_text(json.dumps(manifest))


def test_manifest_claiming_huge_bytes_evicts_nothing(tmp_path: Path) -> None:
    filled(tmp_path)
    edit_manifest(tmp_path, {KEYS[3]: 10**15})
    evicted: list[str] = []
    reopened = DiskStore(tmp_path, 10_000, on_evict=evicted.append)
    assert evicted == [] and len(reopened.keys()) == 30
    assert reopened.stats().occupancy_bytes == 3000 == reopened.shared_occupancy()


def test_manifest_claiming_zero_bytes_does_not_hide_occupancy(tmp_path: Path) -> None:
    filled(tmp_path)
    edit_manifest(tmp_path, {key: 0 for key in KEYS})
    reopened = DiskStore(tmp_path, 10_000)
    assert reopened.stats().occupancy_bytes == 3000 == on_disk_payload(tmp_path)
    small = DiskStore(tmp_path, 1000)  # the budget is enforced against the real sizes
    assert small.stats().occupancy_bytes <= 1000 and on_disk_payload(tmp_path) <= 1000


def test_truncated_or_padded_file_is_dropped_on_open(tmp_path: Path) -> None:
    store = filled(tmp_path, 3)
    cut = store.path_for(KEYS[0])
    cut.write_bytes(cut.read_bytes()[:-4])
    padded = store.path_for(KEYS[1])
    padded.write_bytes(padded.read_bytes() + b"\0" * 4)
    reopened = DiskStore(tmp_path, 10_000)
    assert reopened.keys() == [KEYS[2]] and not cut.exists() and not padded.exists()
    assert reopened.stats().errors == 2


_WRITER = textwrap.dedent("""
    import sys, torch
    from pathlib import Path
    from vlmcache.store import DiskStore
    root, budget, worker = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
    store = DiskStore(root, budget)
    for i in range(60):
        store.put(f"{worker:02x}{i:04x}", {"kv": torch.full((256,), float(i))})  # 1 KiB
        if i % 7 == 0:
            store.get(f"{(worker + 1) % 4:02x}{i:04x}")
    store.close()
""")


def test_four_processes_share_one_budget(tmp_path: Path) -> None:
    budget = 20 * 1024
    procs = [subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path), str(budget),
                               str(w)]) for w in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    assert on_disk_payload(tmp_path) <= budget  # was 3.05x the budget before issue 14
    assert DiskStore(tmp_path, budget).shared_occupancy() == on_disk_payload(tmp_path)


def test_files_and_directories_are_private(tmp_path: Path) -> None:
    root = tmp_path / "store"
    store = filled(root, 2)
    for path in (root, root / "chunks", store.path_for(KEYS[0]).parent):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    for path in (store.path_for(KEYS[0]), root / "manifest.json", root / ".occupancy"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_planted_symlink_chunk_is_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"do not read or overwrite me")
    store = DiskStore(tmp_path / "store", 10_000)
    link = store.path_for(KEYS[0])
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(secret)
    assert store.get(KEYS[0]) is None and not link.is_symlink()
    link.symlink_to(secret)
    assert store.put(KEYS[0], chunk(1))
    assert secret.read_bytes() == b"do not read or overwrite me"
    out = store.get(KEYS[0])
    assert out is not None and torch.equal(out["kv"], chunk(1)["kv"])


def test_planted_symlink_shard_directory_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    store = DiskStore(tmp_path / "store", 10_000)
    store.path_for(KEYS[0]).parent.symlink_to(elsewhere, target_is_directory=True)
    assert not store.put(KEYS[0], chunk(1))
    assert list(elsewhere.iterdir()) == [] and store.stats().errors == 1


def test_torn_or_drifted_counter_is_recounted_from_the_files(tmp_path: Path) -> None:
    filled(tmp_path, 5)
    (tmp_path / ".occupancy").write_bytes(b"12\x00garbage")  # torn by a crash
    store = DiskStore(tmp_path, 10_000)
    assert store.shared_occupancy() == 500
    (tmp_path / ".occupancy").write_bytes(b"0\n")  # drift: a writer died before counting
    assert store.put(KEYS[10], chunk(10))
    assert DiskStore(tmp_path, 10_000).shared_occupancy() == 600 == on_disk_payload(tmp_path)


def test_planted_symlink_counter_is_replaced_not_followed(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"keep")
    root = tmp_path / "store"
    root.mkdir()
    (root / ".occupancy").symlink_to(secret)
    store = DiskStore(root, 10_000)
    assert store.put(KEYS[0], chunk(0)) and store.shared_occupancy() == 100
    assert secret.read_bytes() == b"keep" and not (root / ".occupancy").is_symlink()


def test_repeated_write_failures_log_once_then_a_summary(tmp_path: Path, monkeypatch,
                                                         caplog) -> None:
    import errno

    import vlmcache.store.chunkfile as chunkfile_mod

    def full(f, data):  # type: ignore[no-untyped-def]
        raise OSError(errno.ENOSPC, "No space left on device")

    store = DiskStore(tmp_path, 10_000)
    monkeypatch.setattr(chunkfile_mod, "_write_bytes", full)
    with caplog.at_level("WARNING", logger="vlmcache.store.disk"):
        for key in KEYS:
            assert not store.put(key, chunk(1))
        store.close()
    lines = [r.getMessage() for r in caplog.records if "could not write:" in r.getMessage()]
    assert len(lines) == 2 and "29 more" in lines[1]
    assert store.stats().errors == 31  # 30 chunks and the manifest


def test_reused_chunks_outlive_a_scan_of_one_off_chunks(tmp_path: Path) -> None:
    plain = DiskStore(tmp_path / "lru", 500)
    clock = DiskStore(tmp_path / "clock", 500, protect_reused=True)
    for store in (plain, clock):
        for i in range(3):
            store.put(KEYS[i], chunk(i))
            assert store.get(KEYS[i]) is not None
        for i in range(10, 20):  # one-off chunks
            store.put(KEYS[i], chunk(i))
    assert not any(plain.contains(KEYS[i]) for i in range(3))
    assert all(clock.contains(KEYS[i]) for i in range(3))
    assert clock.stats().occupancy_bytes <= 500
