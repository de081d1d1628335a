"""Fault trials of the shared Redis tier against a real ``redis-server``.

Each trial drives the real :class:`~vlmcache.store.redis_store.RedisChunkStore` and counts,
in the local fault suite's :class:`~vlmcache_lab.faults.FaultResult`, exceptions that
escaped, wrong bytes served (a chunk's content is derived from its key, so every read is
checked), acknowledged writes later missing, and losses without a log line. Used by the
tests (few trials) and by ``benchmarks/redis_reliability.py`` (reliability.json).
Worker processes run ``python -m vlmcache_lab.redis_faults worker ...``.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from vlmcache_lab.faults import FaultResult, captured, chunk_for, same
from vlmcache.store.redis_blobs import RedisBlobStore
from vlmcache.store.redis_link import RedisLink, RedisSettings
from vlmcache.shared.replicator import wait_for
from vlmcache.store.redis_store import RedisChunkStore
from vlmcache_lab import child_env


@dataclass
class RedisFaultResult(FaultResult):
    """The local suite's counters plus the worst lookup time seen in this process."""

    max_lookup_ms: float | None = None
    accounting_mismatch_bytes: int = 0  # |occupancy counted - bytes Redis holds|
    lookups_ms: list[float] = field(default_factory=list, repr=False)

    def as_json(self) -> dict[str, object]:
        out = super().as_json()
        samples = sorted(out.pop("lookups_ms"))  # type: ignore[arg-type]
        out["lookups_timed"] = len(samples)
        out["p99_lookup_ms"] = samples[int(0.99 * (len(samples) - 1))] if samples else None
        return out


def key_for(i: int, salt: str = "") -> str:
    return hashlib.sha256(f"{salt}\0{i}".encode()).hexdigest()


def store_for(url: str, budget: int = 64 << 20, timeout_s: float = 0.005) -> RedisChunkStore:
    link = RedisLink(RedisSettings(url=url, prefix="fault", timeout_s=timeout_s,
                                   connect_timeout_s=max(timeout_s, 0.02), backoff_max_s=0.2))
    return RedisChunkStore(RedisBlobStore(link, "kv", budget, 3600.0))


def check_read(store: RedisChunkStore, key: str, res: RedisFaultResult) -> bool | None:
    """Read ``key``; count a miss, a wrong chunk or an escaped exception. True on a right hit."""
    start = time.perf_counter()
    try:
        got = store.get(key)
    except Exception:
        res.exceptions += 1
        return None
    elapsed_ms = (time.perf_counter() - start) * 1000
    res.lookups_ms.append(elapsed_ms)
    res.max_lookup_ms = max(res.max_lookup_ms or 0.0, elapsed_ms)
    if got is None:
        res.misses += 1
        return False
    if not same(got, chunk_for(key)):
        res.wrong_bytes_served += 1
        return None
    return True


def safe_put(store: RedisChunkStore, key: str, res: RedisFaultResult) -> bool:
    try:
        return store.put(key, chunk_for(key))
    except Exception:
        res.exceptions += 1
        return False


def kill_restart(server: object, trials: int) -> RedisFaultResult:
    """Redis SIGKILLed and restarted (no persistence) between writes and reads."""
    res = RedisFaultResult("redis_killed_restarted")
    store = store_for(server.url)  # type: ignore[attr-defined]
    not_resumed = 0
    for t in range(trials):
        acked = [k for k in (key_for(i, f"kr{t}") for i in range(8)) if safe_put(store, k, res)]
        res.acknowledged += len(acked)
        with captured() as log:
            server.kill()  # type: ignore[attr-defined]
            for k in acked:
                check_read(store, k, res)  # misses while down, bounded by the timeout
            server.start()  # type: ignore[attr-defined]
            if not wait_for(lambda: store.blobs.link.call("ping", lambda c: c.ping()) is True,
                            5):
                not_resumed += 1
            lost = sum(check_read(store, k, res) is False for k in acked)
        res.acknowledged_lost += lost
        res.unlogged_losses += lost > 0 and not log.mentions("unavailable")
        fresh = key_for(999, f"kr{t}")
        if not (safe_put(store, fresh, res) and check_read(store, fresh, res)):
            not_resumed += 1
        res.trials += 1
    res.method = (f"redis-server without persistence: a restart empties it, so every chunk "
                  f"acknowledged before the kill was lost (a miss each; the outage is logged "
                  f"once); {not_resumed} trial(s) where writes and reads did not resume")
    return res


def hung(server: object, trials: int) -> RedisFaultResult:
    """Redis SIGSTOPped: lookups must miss within the bound, then recover after SIGCONT."""
    res = RedisFaultResult("redis_hung")
    store = store_for(server.url)  # type: ignore[attr-defined]
    keys = [key_for(i, "hung") for i in range(trials)]
    for k in keys:
        safe_put(store, k, res)
    server.pause()  # type: ignore[attr-defined]
    try:
        for k in keys:
            check_read(store, k, res)
            res.trials += 1
    finally:
        server.resume()  # type: ignore[attr-defined]
    wait_for(lambda: store.blobs.link.call("ping", lambda c: c.ping()) is True, 5)
    back = sum(check_read(store, k, res) is True for k in keys)
    res.method = (f"5 ms socket timeout; lookups while SIGSTOPped all missed; "
                  f"{back}/{len(keys)} read back after SIGCONT")
    return res


def corrupt(server: object, trials: int) -> RedisFaultResult:
    """Values damaged inside Redis (bit flip, truncation, another key's value, garbage)."""
    res = RedisFaultResult("redis_corrupt_value")
    store = store_for(server.url, timeout_s=1.0)  # type: ignore[attr-defined]
    client = server.client()  # type: ignore[attr-defined]
    for t in range(trials):
        k, other = key_for(t, "corrupt"), key_for(t, "other")
        safe_put(store, k, res)
        safe_put(store, other, res)
        vkey = store.blobs.value_key(k)
        raw = bytearray(client.get(vkey))
        how = t % 4
        if how == 0:
            raw[random.randrange(len(raw))] ^= 1 << random.randrange(8)
        elif how == 1:
            raw = raw[: random.randrange(len(raw))]
        elif how == 2:
            raw = bytearray(client.get(store.blobs.value_key(other)))
        else:
            raw = bytearray(os.urandom(len(raw)))
        client.set(vkey, bytes(raw))
        with captured() as log:
            missed = check_read(store, k, res) is False  # anything else: counted as wrong
        res.unlogged_losses += missed and not log.mentions(k)
        res.trials += 1
    res.method = "bit flips, truncations, another key's value, random bytes: all misses"
    return res


def _worker_cmd(url: str, seed: int, ops: int, budget: int, acks: Path) -> list[str]:
    return [sys.executable, "-m", "vlmcache_lab.redis_faults", "worker", "--url", url,
            "--seed", str(seed), "--ops", str(ops), "--budget", str(budget), "--acks", str(acks)]


def four_processes(server: object, ops: int, workdir: Path) -> RedisFaultResult:
    """4 processes writing and reading one Redis namespace under one budget."""
    res = RedisFaultResult("redis_4_processes")
    budget = 4 << 20
    procs = [subprocess.Popen(_worker_cmd(server.url, s, ops, budget,  # type: ignore[attr-defined]
                                          workdir / f"acks{s}"), stdout=subprocess.PIPE,
                              env=child_env())
             for s in range(4)]
    for p in procs:
        out, _ = p.communicate(timeout=600)
        fields = dict(kv.split("=") for kv in out.decode().split())
        res.trials += int(fields["ops"])
        res.exceptions += int(fields["exceptions"]) + (p.returncode != 0)
        res.wrong_bytes_served += int(fields["wrong"])
        res.misses += int(fields["misses"])
    used = store_for(server.url, budget, 1.0).blobs.stats().occupancy_bytes  # type: ignore
    held = _held_bytes(server, budget)
    res.over_budget_bytes = max(0, used - budget)
    res.accounting_mismatch_bytes = abs(used - held)
    res.acknowledged = sum(len((workdir / f"acks{s}").read_text().split()) for s in range(4))
    res.method = (f"one {budget} B budget for all 4 writers: occupancy {used} B, values held "
                  f"{held} B; misses are evictions by the other writers")
    return res


def kill_writer(server: object, trials: int, workdir: Path) -> RedisFaultResult:
    """A writer process SIGKILLed mid-run: acknowledged chunks intact, accounting exact."""
    res = RedisFaultResult("redis_kill9_writer")
    budget = 64 << 20
    for t in range(trials):
        acks = workdir / f"kill{t}"
        p = subprocess.Popen(_worker_cmd(server.url, 100 + t, 100_000, budget,  # type: ignore
                                         acks), stdout=subprocess.DEVNULL, env=child_env())
        wait_for(lambda: acks.exists() and acks.stat().st_size > 0, 60)  # writing now
        time.sleep(random.random() * 0.3)
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
        store = store_for(server.url, budget, 1.0)  # type: ignore[attr-defined]
        acked = acks.read_text().split() if acks.exists() else []
        res.acknowledged += len(acked)
        res.acknowledged_lost += sum(check_read(store, k, res) is False for k in acked)
        used = store.blobs.stats().occupancy_bytes
        res.accounting_mismatch_bytes += abs(used - _held_bytes(server, budget))
        res.trials += 1
    res.method = ("writer SIGKILLed while putting; a put is one Lua script, so a kill "
                  "never leaves a half-counted entry")
    return res


def _held_bytes(server: object, budget: int) -> int:
    store = store_for(server.url, budget, 1.0)  # type: ignore[attr-defined]
    client = server.client()  # type: ignore[attr-defined]
    return sum(client.strlen(store.blobs.value_key(k)) for k in store.keys())


def worker(url: str, seed: int, ops: int, budget: int, acks: Path) -> str:
    """One process of the multi-process trials: puts its own keys, reads everyone's."""
    res = RedisFaultResult("worker")
    store = store_for(url, budget, timeout_s=1.0)
    rng = random.Random(seed)
    with open(acks, "a") as ack:
        for i in range(ops):
            if rng.random() < 0.5:
                k = key_for(i, f"w{seed}")
                if safe_put(store, k, res):
                    ack.write(k + "\n")
                    ack.flush()
            else:
                check_read(store, key_for(rng.randrange(max(i, 1)), f"w{rng.randrange(4)}"), res)
            res.trials += 1
    return (f"ops={res.trials} exceptions={res.exceptions} wrong={res.wrong_bytes_served} "
            f"misses={res.misses}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("role", choices=["worker"])
    ap.add_argument("--url", required=True)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--ops", type=int, required=True)
    ap.add_argument("--budget", type=int, required=True)
    ap.add_argument("--acks", type=Path, required=True)
    a = ap.parse_args(argv)
    print(worker(a.url, a.seed, a.ops, a.budget, a.acks))


if __name__ == "__main__":
    main()
