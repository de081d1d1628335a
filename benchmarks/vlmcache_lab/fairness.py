"""Tenant fairness (seed 004): does one tenant's flood of unique images evict another's catalog?

A store-level simulation: it drives the real :class:`~vlmcache.store.MemoryStore` (the tier an
encoder output or a KV chunk lands in first) with LLaVA-1.5-sized encoder outputs (576 tokens
x 4096 x fp16 = 4.5 MiB) under the default 1 GiB ``encoder_memory_budget``, through the same
get-miss-put path a request takes. No engine runs: only the store decides hits. Tensors are
views of one buffer handed over with ``owned=True`` so the run measures policy, not memcpy.

Tenant B replays a catalog drawn zipf(s) (about 90% of its requests repeat an earlier one);
tenant A sends only unique images, ``flood`` of them per B request. Rows: ``baseline_lru``
(global LRU: the store before issue 14) and ``with_quotas`` (per-tenant quota, admission on
second sight, eviction favouring reuse), each with B's hit rate alone and flooded.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from vlmcache.store.memory import MemoryStore
from vlmcache.store.policy import TierPolicy

CHUNK_SHAPE = (576, 4096)  # one LLaVA-1.5 image's encoder output, fp16
CHUNK_DTYPE = torch.float16


@dataclass(frozen=True)
class Workload:
    """The simulated traffic (all draws from one seeded generator)."""

    capacity_bytes: int = 1024**3
    catalog: int = 500
    zipf_s: float = 1.1
    b_requests: int = 5000
    flood: int = 3
    seed: int = 4


def zipf_draws(n_items: int, s: float, count: int, rng: np.random.Generator) -> np.ndarray:
    """``count`` item ranks from a zipf(s) law bounded to ``n_items``."""
    weights = np.arange(1, n_items + 1, dtype=np.float64) ** -s
    return rng.choice(n_items, size=count, p=weights / weights.sum())


def trace(work: Workload, flooded: bool) -> list[tuple[str, str]]:
    """(tenant, key) requests: B's catalog draws, each followed by ``flood`` unique A images."""
    rng = np.random.default_rng(work.seed)
    out: list[tuple[str, str]] = []
    unique = 0
    for item in zipf_draws(work.catalog, work.zipf_s, work.b_requests, rng):
        out.append(("b", f"b0{int(item):08x}"))
        for _ in range(work.flood if flooded else 0):
            out.append(("a", f"a0{unique:08x}"))
            unique += 1
    return out


def replay(store: MemoryStore, requests: list[tuple[str, str]]) -> dict[str, float]:
    """Hit rate per tenant over ``requests`` (miss: the request computes and offers it)."""
    chunk = {"encoder_output": torch.zeros(CHUNK_SHAPE, dtype=CHUNK_DTYPE)}
    for tenant, key in requests:
        if store.get(key, tenant=tenant) is None:
            store.put(key, chunk, owned=True, tenant=tenant)
    return {s.tenant: round(s.hit_rate, 4) for s in store.tenant_stats()}  # type: ignore[misc]


def b_rates(policy: TierPolicy | None, work: Workload) -> dict[str, float]:
    alone = replay(MemoryStore(work.capacity_bytes, policy=policy), trace(work, False))["b"]
    flooded = replay(MemoryStore(work.capacity_bytes, policy=policy), trace(work, True))["b"]
    return {"b_hit_rate_alone": alone, "b_hit_rate_flooded": flooded,
            "flooded_over_alone": round(flooded / alone, 4) if alone else 0.0}


#: The disk rows: the same traffic on the real DiskStore with chunks this small (as many fit
#: as in the memory rows; what is measured is the eviction policy, not file I/O).
DISK_CHUNK_ELEMS = 16 * 1024


def disk_replay(root: Path, quota: bool, work: Workload, flooded: bool) -> float:
    """B's hit rate on a DiskStore (charging each put to its tenant) over the same trace."""
    from vlmcache.store.disk import DiskStore

    chunk_bytes = DISK_CHUNK_ELEMS * 2
    capacity = work.capacity_bytes // (int(np.prod(CHUNK_SHAPE)) * 2) * chunk_bytes
    store = DiskStore(root, capacity, protect_reused=quota,
                      tenant_quota_bytes=capacity // 2 if quota else 0)
    chunk = {"encoder_output": torch.zeros(DISK_CHUNK_ELEMS, dtype=CHUNK_DTYPE)}
    hits = asks = 0
    for tenant, key in trace(work, flooded):
        found = store.get(key) is not None
        if tenant == "b":
            hits, asks = hits + found, asks + 1
        if not found:
            store.put(key, chunk, tenant=tenant)
    return round(hits / asks, 4) if asks else 0.0


def disk_rows(work: Workload) -> dict[str, dict[str, float]]:
    """Global LRU vs per-tenant quota (+ reuse eviction) on the disk tier."""
    import tempfile

    out = {}
    for name, quota in (("baseline_lru", False), ("with_quota", True)):
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            alone = disk_replay(Path(a), quota, work, False)
            flooded = disk_replay(Path(b), quota, work, True)
        out[name] = {"b_hit_rate_alone": alone, "b_hit_rate_flooded": flooded,
                     "flooded_over_alone": round(flooded / alone, 4) if alone else 0.0}
    return out


def fair_policy(work: Workload) -> TierPolicy:
    """What the rows call ``with_quotas``: half the tier per tenant, second sight, SLRU."""
    return TierPolicy(tenant_quota_bytes=work.capacity_bytes // 2, admission="second_sight",
                      protect_reused=True)


def run(work: Workload) -> dict[str, object]:
    draws = trace(work, False)
    reuse = 1 - len({k for _, k in draws}) / len(draws)
    zipf = replay(MemoryStore(work.capacity_bytes, policy=fair_policy(work)), draws)["b"]
    zipf_lru = replay(MemoryStore(work.capacity_bytes), draws)["b"]
    chunk_bytes = int(np.prod(CHUNK_SHAPE)) * torch.finfo(CHUNK_DTYPE).bits // 8
    return {
        "baseline_lru": b_rates(None, work),
        "with_quotas": {**b_rates(fair_policy(work), work),
                        "policy": asdict(fair_policy(work))},
        "ablation": {
            "quota_and_reuse_only": b_rates(TierPolicy(tenant_quota_bytes=work.capacity_bytes // 2,
                                                       protect_reused=True), work),
            "second_sight_only": b_rates(TierPolicy(admission="second_sight"), work),
        },
        "disk": {**disk_rows(Workload(b_requests=min(work.b_requests, 2000),
                                      flood=work.flood)),
                 "note": "the real DiskStore, 2000 B requests, chunks of "
                         f"{DISK_CHUNK_ELEMS * 2} B (as many fit as in the memory rows); "
                         "quota: half the tier per tenant, reuse-favouring eviction; no "
                         "admission filter (the disk tier's is set per deployment)"},
        "zipf_hit_rate": zipf,
        "zipf_hit_rate_lru": zipf_lru,
        "workload": {**asdict(work), "b_reuse": round(reuse, 4), "chunk_bytes": chunk_bytes,
                     "chunks_that_fit": work.capacity_bytes // chunk_bytes},
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/fairness.json"))
    parser.add_argument("--b-requests", type=int, default=Workload.b_requests)
    parser.add_argument("--flood", type=int, default=Workload.flood)
    args = parser.parse_args(argv)
    work = Workload(b_requests=args.b_requests, flood=args.flood)
    started = time.perf_counter()
    result = run(work)
    result.update({
        "command": " ".join(["python", "benchmarks/fairness.py", *sys.argv[1:]]),
        "device": f"CPU ({platform.machine()}, {platform.processor() or 'unknown'}), "
                  "store-level simulation, no engine",
        "note": __doc__.split("\n\n")[1].replace("\n", " "),
        "wall_s": round(time.perf_counter() - started, 2),
    })
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("baseline_lru", "with_quotas", "disk",
                                            "zipf_hit_rate")},
                     indent=2))
