"""Fault trials of the local stores (issue 14): each injects one kind of fault and counts
what went wrong: exceptions that escaped vlmcache, wrong bytes served, chunks acknowledged
and later lost, and losses that were not a miss with a log line.

Used by ``benchmarks/tests/test_faults.py`` (few trials, bounded time) and ``benchmarks/reliability.py`` (more
trials, results in ``benchmarks/results/reliability.json``). Trials that need processes
(kill -9, four writers) live in :mod:`vlmcache_lab.fault_procs`.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import random
import shutil
import subprocess
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterator

import torch

from vlmcache.store.disk import DiskStore
from vlmcache.store.memory import MemoryStore
from vlmcache.store.tiered import TieredStore

CHUNK_NUMEL = 16 * 1024  # 32 KiB of fp16 per chunk: small enough for many trials
LOGGER = "vlmcache"


@dataclass
class FaultResult:
    """Counters of one fault kind over its trials (all but ``trials`` should stay 0)."""

    kind: str
    trials: int = 0
    acknowledged: int = 0
    exceptions: int = 0
    wrong_bytes_served: int = 0
    acknowledged_lost: int = 0
    unlogged_losses: int = 0
    misses: int = 0
    over_budget_bytes: int = 0
    method: str = ""

    def as_json(self) -> dict[str, object]:
        out = asdict(self)
        out.pop("kind")
        return out


def chunk_for(key: str) -> dict[str, torch.Tensor]:
    """The deterministic content stored under ``key`` (so any reader can check bytes)."""
    gen = torch.Generator().manual_seed(int(key[:12], 16))
    return {"k": torch.randn(CHUNK_NUMEL // 2, generator=gen).half(),
            "v": torch.randn(CHUNK_NUMEL // 2, generator=gen).half()}


def same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> bool:
    return got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in want)


def key_of(prefix: int, i: int) -> str:
    return f"{prefix:04x}{i:08x}" + "0" * 52


def keys(prefix: int, n: int) -> list[str]:
    return [key_of(prefix, i) for i in range(n)]


class WarningLog(logging.Handler):
    """Collects vlmcache's WARNING+ messages while installed."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())

    def mentions(self, text: str) -> bool:
        return any(text in m for m in self.messages)


@contextlib.contextmanager
def captured() -> Iterator[WarningLog]:
    handler = WarningLog()
    log = logging.getLogger(LOGGER)
    log.addHandler(handler)
    try:
        yield handler
    finally:
        log.removeHandler(handler)


@contextlib.contextmanager
def scratch() -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix="vlmcache-fault-"))
    try:
        yield root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def read_back(res: FaultResult, store: DiskStore | TieredStore, keys_: list[str],
              log: WarningLog, must_have: set[str]) -> None:
    """Read every key: count wrong bytes, misses, unlogged losses and lost must-haves."""
    res.acknowledged += len(must_have)
    for key in keys_:
        try:
            got = store.get(key)
        except Exception:
            res.exceptions += 1
            continue
        if got is None:
            res.misses += 1
            res.acknowledged_lost += key in must_have
        elif not same(got, chunk_for(key)):
            res.wrong_bytes_served += 1


def _damage_trial(res: FaultResult, rng: random.Random, damage: Callable[[Path], None]) -> None:
    with scratch() as root, captured() as log:
        names = keys(rng.randrange(1 << 16), 12)
        store = DiskStore(root, 1 << 30)
        for key in names:
            store.put(key, chunk_for(key))
        store.close()
        victim = rng.choice(names)
        damage(store.path_for(victim))
        for reader in (store, DiskStore(root, 1 << 30)):  # the live index, then a reopen
            before = res.misses
            read_back(res, reader, names, log, set(names) - {victim})
            lost = res.misses - before
            res.unlogged_losses += lost > 0 and not log.mentions(victim)


def corrupt_chunk(trials: int, seed: int = 0) -> FaultResult:
    """One random byte of one chunk file flipped (header or payload)."""
    res, rng = FaultResult("corrupt_chunk", method="flip one random byte"), random.Random(seed)

    def flip(path: Path) -> None:
        data = bytearray(path.read_bytes())
        pos = rng.randrange(len(data))
        data[pos] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(data))

    return repeat(res, trials, lambda _: _damage_trial(res, rng, flip))


def truncated_chunk(trials: int, seed: int = 1) -> FaultResult:
    """One chunk file cut at a random length (0 .. size-1)."""
    res, rng = FaultResult("truncated_chunk", method="truncate at a random length"), \
        random.Random(seed)

    def cut(path: Path) -> None:
        with open(path, "r+b") as f:
            f.truncate(rng.randrange(path.stat().st_size))

    return repeat(res, trials, lambda _: _damage_trial(res, rng, cut))


_MANIFEST_DAMAGE: list[Callable[[bytes, random.Random], bytes]] = [
    lambda raw, rng: raw[: rng.randrange(len(raw))],
    lambda raw, rng: bytes(rng.randrange(256) for _ in range(64)),
    lambda raw, rng: raw.replace(b'"bytes":', b'"bytes":1000000000000000', 1),
    lambda raw, rng: raw.replace(b'"bytes":32768', b'"bytes":0'),
    lambda raw, rng: raw.replace(b'"last_used":', b'"last_used":-', 3),
    lambda raw, rng: b'{"format":1,"entries":{"' + b"a" * 64 + b'":{"bytes":5}}}',
]


def corrupt_manifest(trials: int, seed: int = 2) -> FaultResult:
    """The manifest truncated, garbage, or lying about sizes and ages; then a reopen."""
    res, rng = FaultResult("corrupt_manifest", method="truncate/garbage/edit manifest.json "
                           "(bytes 10^15 or 0, negative ages, unknown keys), reopen"), \
        random.Random(seed)
    return repeat(res, trials, lambda i: _manifest_trial(
        res, rng, _MANIFEST_DAMAGE[i % len(_MANIFEST_DAMAGE)]))


def _manifest_trial(res: FaultResult, rng: random.Random,
                    damage: Callable[[bytes, random.Random], bytes]) -> None:
    with scratch() as root, captured() as log:
        names = keys(rng.randrange(1 << 16), 12)
        budget = 12 * CHUNK_NUMEL * 2
        store = DiskStore(root, budget)
        for key in names:
            store.put(key, chunk_for(key))
        store.close()
        manifest = root / "manifest.json"
        manifest.write_bytes(damage(manifest.read_bytes(), rng))
        reopened = DiskStore(root, budget)  # the budget fits all 12: nothing may go
        read_back(res, reopened, names, log, set(names))


def disk_full(trials: int, seed: int = 3) -> FaultResult:
    """Writes into a 1 MiB tmpfs (root only; else ENOSPC simulated) with a larger budget."""
    res, rng = FaultResult("disk_full"), random.Random(seed)
    with _small_disk() as (root, method):
        res.method = method
        for _ in range(trials):
            res.trials += 1
            _guard(res, lambda: _full_trial(res, rng, root))
    return res


def _full_trial(res: FaultResult, rng: random.Random, root: Path) -> None:
    from vlmcache.tiers.exact import ExactTextTier

    with captured() as log:
        names = keys(rng.randrange(1 << 16), 48)  # 1.5 MiB of chunks into 1 MiB
        store = TieredStore(MemoryStore(1 << 20), DiskStore(root / "kv", 1 << 30))
        stored = [k for k in names if store.disk.put(k, chunk_for(k))]  # type: ignore[union-attr]
        failed = len(names) - len(stored)
        res.unlogged_losses += failed > 0 and not log.mentions("could not write")
        _fill(root / "filler")
        exact = ExactTextTier(root / "exact.jsonl", "ns", 1000)
        exact.record("written on a full disk", ["h"], "t", ["aa"], 1)
        os.unlink(root / "filler")
        for key in stored[: len(stored) // 2]:  # space comes back
            store.delete(key)
        exact.record("written after space came back", ["h"], "t", ["bb"], 1)
        reread = ExactTextTier(root / "exact.jsonl", "ns", 1000)
        res.acknowledged_lost += reread.lookup("written after space came back", ["h"], "t") \
            is None
        read_back(res, DiskStore(root / "kv", 1 << 30), stored[len(stored) // 2:], log,
                  set(stored[len(stored) // 2:]))
    shutil.rmtree(root / "kv", ignore_errors=True)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(root / "exact.jsonl")


def _fill(path: Path) -> None:
    """Take what space is left (up to 1 MiB) so the next write meets a full disk."""
    with contextlib.suppress(OSError), open(path, "wb", buffering=0) as f:
        for _ in range(256):
            f.write(b"\0" * 4096)


@contextlib.contextmanager
def _small_disk() -> Iterator[tuple[Path, str]]:
    with scratch() as root:
        mount = root / "tmpfs"
        mount.mkdir()
        cmd = ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)]
        if os.geteuid() == 0 and shutil.which("mount") and subprocess.run(
                cmd, capture_output=True).returncode == 0:
            try:
                yield mount, "1 MiB tmpfs (mount -t tmpfs -o size=1m)"
            finally:
                subprocess.run(["umount", str(mount)], capture_output=True)
            return
        with _simulated_enospc(1 << 20):
            yield mount, "ENOSPC simulated past 1 MiB of chunk writes (no root for tmpfs)"


@contextlib.contextmanager
def _simulated_enospc(limit: int) -> Iterator[None]:
    import vlmcache.store.chunkfile as chunkfile

    written = [0]
    real = chunkfile._write_bytes

    def full(f, data):  # type: ignore[no-untyped-def]
        if written[0] + len(data) > limit:
            f.write(data[: max(0, limit - written[0])])
            raise OSError(errno.ENOSPC, "No space left on device (simulated)")
        written[0] += len(data)
        real(f, data)

    chunkfile._write_bytes = full
    try:
        yield
    finally:
        chunkfile._write_bytes = real


def repeat(res: FaultResult, trials: int, trial: Callable[[int], None]) -> FaultResult:
    """Run ``trial(i)`` ``trials`` times, counting trials and escaped exceptions."""
    for i in range(trials):
        res.trials += 1
        _guard(res, lambda: trial(i))
    return res


def _guard(res: FaultResult, trial: Callable[[], None]) -> None:
    """Run one trial; an exception escaping vlmcache is counted, never raised."""
    try:
        trial()
    except Exception:
        logging.getLogger(__name__).exception("fault trial %s raised", res.kind)
        res.exceptions += 1
