"""Two engine replicas sharing one Redis: what one answered, the other reuses.

The orchestrator (:func:`run_replicas`) starts a ``redis-server`` and two replica processes
(``python -m vlmcache_lab.redis_replicas replica ...``), each a ``CachedLLM`` with its own
store directory and the same ``redis_url``, and drives them over stdin/stdout:

1. A answers requests; B then gets the same requests (B never saw them: any reuse in B
   came through Redis: exact records, KV chunks);
2. Redis is SIGKILLed; both keep answering new requests (misses, no errors);
3. Redis restarts (empty); A answers new requests, then B gets them (sharing resumed).

``shared_hits`` counts B's requests (steps 1 and 3) answered with reuse: a cascade hit or
KV tokens loaded; ``errors`` counts requests that raised or returned no output, in both.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any, Callable

from vlmcache_lab import child_env

MARK = "@@vlmcache-replica "
REPORT_FIELDS = ("hit_tier", "prompt_tokens", "tokens_loaded", "tokens_from_prefix_cache",
                 "tokens_computed", "load_failed_blocks", "kv_cost_choice", "kv_cost_reason",
                 "latency_s")
PHASE_1, OUTAGE, PHASE_3 = (0, 1, 2), (3, 4), (5, 6)


@dataclass
class ReplicaRun:
    """The ``replicas`` entry of reliability.json."""

    requests: int = 0
    errors: int = 0
    shared_hits: int = 0
    shared_hits_after_restart: int = 0
    shared_kv_hits: int = 0
    shared_kv_tokens_loaded: int = 0
    same_output_as_first_replica: int = 0
    compared: int = 0
    outage_requests: int = 0
    rows: list[dict[str, Any]] = field(default_factory=list)


def replica_main(model: str, store: str, redis_url: str) -> None:
    """One replica: answer the seeds each ``run`` command names, report each request."""
    from vlmcache.api import CachedLLM
    from vlmcache.config import VlmCacheConfig
    from vlmcache.testing.engine_job import BLOCK_SIZE, engine_args, greedy, make_request

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger("vlmcache").setLevel(logging.INFO)  # per-request lines in the log
    # a small CPU offload region: two engines share this machine's /dev/shm
    config = VlmCacheConfig(store_path=store, block_size=BLOCK_SIZE, disk_write="sync",
                            memory_budget=256 * 1024**2,
                            redis_url=redis_url, redis_sync_interval_s=0.1,
                            redis_backoff_max_s=0.5)
    llm = CachedLLM(model, config, engine_args=engine_args())
    _say({"ready": True})
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "quit":
            break
        rows = []
        for seed in cmd["seeds"]:
            try:
                out = llm.generate([make_request(seed)], greedy())[0]
                rep = out.report.to_dict()
                rows.append({"seed": seed, "token_ids": list(out.token_ids),
                             **{k: rep[k] for k in REPORT_FIELDS}})
            except Exception as exc:  # counted as an error by the orchestrator
                rows.append({"seed": seed, "error": f"{type(exc).__name__}: {exc}"[:300]})
        _say({"rows": rows})
    llm.close()


def _say(obj: dict[str, Any]) -> None:
    print(MARK + json.dumps(obj), flush=True)


def _hear(stream: IO[str], timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = stream.readline()
        if not line:
            raise RuntimeError("replica exited")
        if line.startswith(MARK):
            return json.loads(line[len(MARK):])
    raise TimeoutError("replica did not answer")


class _Replica:
    def __init__(self, model: str, store: Path, url: str, log: Path) -> None:
        self.log = open(log, "w")
        cmd = [sys.executable, "-m", "vlmcache_lab.redis_replicas", "replica",
               "--model", model, "--store", str(store), "--redis-url", url]
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.log, text=True, env=child_env())

    def wait_ready(self, timeout_s: float = 900) -> None:
        _hear(self.proc.stdout, timeout_s)  # type: ignore[arg-type]

    def run(self, seeds: tuple[int, ...]) -> list[dict[str, Any]]:
        self.proc.stdin.write(json.dumps({"op": "run", "seeds": list(seeds)}) + "\n")  # type: ignore
        self.proc.stdin.flush()  # type: ignore[union-attr]
        return _hear(self.proc.stdout, 600)["rows"]  # type: ignore[arg-type]

    def quit(self) -> None:
        try:
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")  # type: ignore
            self.proc.stdin.flush()  # type: ignore[union-attr]
            self.proc.wait(timeout=120)
        except Exception:
            self.proc.kill()
        self.log.close()


Ask = Callable[[tuple[int, ...]], list[dict[str, Any]]]
Tally = Callable[[str, list[dict[str, Any]], Any], Any]


def three_steps(a: Ask, b: Ask, server: Any, tally: Tally, settle_s: float
                ) -> tuple[int, int, int]:
    """The three steps of the module docstring, for any two replicas (``a``/``b`` answer
    seeds) and Redis server; ``tally(who, rows, first)`` counts rows (``first``: A's
    answers, given for B). Returns (shared hits, of them after the restart, outage requests)."""
    first = tally("A", a(PHASE_1), None)
    time.sleep(settle_s)  # the replicators' sync interval and the writers' queues
    shared = tally("B", b(PHASE_1), first)
    server.kill()
    for who, ask in (("A-outage", a), ("B-outage", b)):
        tally(who, ask(OUTAGE), None)
    server.start()
    time.sleep(settle_s)  # the links' reconnect backoff
    first = tally("A", a(PHASE_3), None)
    time.sleep(settle_s)
    after = tally("B", b(PHASE_3), first)
    return shared + after, after, len(OUTAGE) * 2


def run_replicas(model: str, work: Path, server: Any, settle_s: float = 1.5) -> ReplicaRun:
    """The three steps of the module docstring against ``server`` (a ``RedisServer``)."""
    a = _Replica(model, work / "store-a", server.url, work / "replica-a.log")
    b = _Replica(model, work / "store-b", server.url, work / "replica-b.log")
    res = ReplicaRun()
    try:
        a.wait_ready()
        b.wait_ready()
        res.shared_hits, res.shared_hits_after_restart, res.outage_requests = three_steps(
            a.run, b.run, server, lambda who, rows, first: _tally(res, who, rows, first),
            settle_s)
    finally:
        a.quit()
        b.quit()
    return res


def _tally(res: ReplicaRun, who: str, rows: list[dict[str, Any]],
           first: dict[int, list[int]] | None) -> Any:
    """Count errors; for B (``first`` given) count reuse and same outputs as A."""
    reused = 0
    for row in rows:
        res.requests += 1
        row["replica"] = who
        res.rows.append(row)
        if "error" in row or not row.get("token_ids"):
            res.errors += 1
            continue
        if first is not None:
            hit = row["hit_tier"] is not None or row["tokens_loaded"] > 0
            reused += hit
            res.shared_kv_hits += row["tokens_loaded"] > 0
            res.shared_kv_tokens_loaded += row["tokens_loaded"]
            if first.get(row["seed"]):  # A answered it: outputs comparable
                res.compared += 1
                res.same_output_as_first_replica += row["token_ids"] == first[row["seed"]]
    if first is None:
        return {r["seed"]: r.get("token_ids") for r in rows}
    return reused


def result_dict(res: ReplicaRun) -> dict[str, Any]:
    d = asdict(res)
    d["rows"] = [{k: v for k, v in r.items() if k != "token_ids"} for r in res.rows]
    return d


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("role", choices=["replica"])
    ap.add_argument("--model", required=True)
    ap.add_argument("--store", required=True)
    ap.add_argument("--redis-url", required=True)
    a = ap.parse_args(argv)
    replica_main(a.model, a.store, a.redis_url)


if __name__ == "__main__":
    main()
