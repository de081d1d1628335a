"""The exact tier's JSON-lines log under faults (issue 14): torn tails, privacy, symlinks."""

from __future__ import annotations

import errno
import logging
import os
import stat


import vlmcache.tiers.exact as exact_mod
from vlmcache.tiers.exact import ExactTextTier


def tier(path):
    return ExactTextTier(path, "ns1", 100)


def test_torn_tail_never_swallows_the_next_record(tmp_path, monkeypatch, caplog):
    path = tmp_path / "exact.jsonl"
    t = tier(path)
    t.record("first prompt", ["h1"], None, ["aa"], 10)
    real_write = os.write

    def disk_full(fd, data):  # half the line reaches the disk, then ENOSPC
        real_write(fd, bytes(data[: len(data) // 2]))
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(exact_mod.os, "write", disk_full)
    with caplog.at_level(logging.WARNING):
        t.record("torn prompt", ["h2"], None, ["bb"], 10)  # kept in memory, logged
    assert "cannot persist" in caplog.text
    monkeypatch.setattr(exact_mod.os, "write", real_write)
    t.record("after space came back", ["h3"], None, ["cc"], 10)
    reloaded = tier(path)
    assert reloaded.lookup("first prompt", ["h1"], None) is not None
    assert reloaded.lookup("after space came back", ["h3"], None) is not None
    assert reloaded.lookup("torn prompt", ["h2"], None) is None  # a loss is only a miss
    assert len(reloaded) == 2


def test_torn_tail_left_by_a_crash_is_repaired_on_the_next_append(tmp_path):
    path = tmp_path / "exact.jsonl"
    tier(path).record("one", ["h1"], None, ["aa"], 1)
    with open(path, "ab") as f:
        f.write(b'{"key":"dead","canonical_pro')  # kill -9 mid-write
    t = tier(path)
    assert len(t) == 1
    t.record("two", ["h2"], None, ["bb"], 1)
    again = tier(path)
    assert again.lookup("one", ["h1"], None) and again.lookup("two", ["h2"], None)


def test_log_and_compacted_log_are_private(tmp_path):
    path = tmp_path / "sub" / "exact.jsonl"
    t = ExactTextTier(path, "ns1", 2)
    for i in range(200):  # forces compactions
        t.record(f"prompt {i}", [f"h{i}"], None, ["aa"], 1)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["exact.jsonl"]
    assert len(ExactTextTier(path, "ns1", 2)) == 2


def test_planted_symlink_log_is_not_followed(tmp_path, caplog):
    secret = tmp_path / "secret"
    secret.write_text('{"not": "a record"}\n')
    path = tmp_path / "exact.jsonl"
    path.symlink_to(secret)
    with caplog.at_level(logging.WARNING):
        t = tier(path)  # neither read through the link ...
        t.record("one", ["h1"], None, ["aa"], 1)  # ... nor written through it
    assert len(t) == 1 and t.lookup("one", ["h1"], None) is not None
    assert secret.read_text() == '{"not": "a record"}\n'
    assert "cannot" in caplog.text
