"""The intent journal: acknowledged writes a crash lost are reported at the next start."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

from vlmcache.store.disk import DiskStore
from vlmcache.store.journal import IntentJournal, orphaned_count, recover, unfinished
from vlmcache.store.memory import MemoryStore
from vlmcache.store.tiered import JOURNAL, TieredStore
from vlmcache.store.writeback import WriteBehind


def test_unfinished_keys_are_those_acknowledged_and_never_landed():
    assert sorted(unfinished("+a\n+b\n-a\n+c\n+c\n-c\n+d")) == ["b", "c"]  # "+d": torn


def test_a_live_journal_is_left_alone_and_a_clean_close_removes_it(tmp_path):
    journal = IntentJournal(tmp_path)
    journal.acked("k1")
    assert journal.path.stat().st_mode & 0o777 == 0o600
    assert recover(tmp_path).count == 0 and journal.path.exists()  # its owner lives
    assert orphaned_count(tmp_path) == 0
    journal.landed("k1")
    journal.close()
    assert not journal.path.exists()


def test_a_journal_with_nothing_pending_is_compacted(tmp_path, monkeypatch):
    monkeypatch.setattr("vlmcache.store.journal.COMPACT_BYTES", 100)
    journal = IntentJournal(tmp_path)
    for i in range(20):
        journal.acked(f"{i:064x}")
        journal.landed(f"{i:064x}")
    assert journal.path.stat().st_size < 300  # not 20 x 2 lines of 66 bytes
    journal.close()


_WRITER = textwrap.dedent("""
    import sys, time, torch
    from vlmcache.store.disk import DiskStore
    from vlmcache.store.memory import MemoryStore
    from vlmcache.store.tiered import TieredStore

    class Stuck:  # the writer thread's disk: a write that never ends
        def put(self, key, tensors, *, tenant=None):
            time.sleep(3600)

    store = TieredStore(MemoryStore(1 << 20), DiskStore(sys.argv[1], 1 << 20),
                        write_behind_bytes=10 * 64)
    store.writer._disk = Stuck()
    for i in range(30):
        if store.put(f"{i:064x}", {"t": torch.full((16,), float(i))}):
            print(f"{i:064x}", flush=True)
    print("done", flush=True)
    time.sleep(3600)
""")


def test_a_killed_writer_loses_at_most_its_queue_and_the_next_start_reports_it(
        tmp_path, caplog):
    """Issue 33 item 7: a kill -9 lost up to 10x the write-behind queue of acknowledged
    chunks, and nothing said so after the restart."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    child = subprocess.Popen([sys.executable, "-c", _WRITER, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True, env=env)
    assert child.stdout is not None
    acked = []
    for line in child.stdout:
        if line.strip() == "done":
            break
        acked.append(line.strip())
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    disk = DiskStore(tmp_path, 1 << 20)
    lost = [key for key in acked if not disk.contains(key)]
    assert len(acked) == 30 and len(lost) == 10  # the queue (10 chunks of 64 B), no more
    with caplog.at_level("WARNING", logger="vlmcache.store.journal"):
        store = TieredStore(MemoryStore(1 << 20), disk, write_behind_bytes=1 << 20)
    assert store.writer is not None and store.writer.stats().lost_in_crash == 10
    assert "10 acknowledged chunk writes" in caplog.text
    assert [p.name for p in (tmp_path / JOURNAL).glob("*.intent")] == \
        [store.writer._journal.path.name]  # the crashed one was claimed; ours lives
    store.close()
    again = WriteBehind(disk, 1 << 20, journal_dir=tmp_path / JOURNAL)
    assert again.stats().lost_in_crash == 0  # reported once
    again.close()
