"""``vlmcache proxy --workers N``: N front processes on one port, sharing tiers through Redis.

One front process is the ceiling of a proxy under load (issue 35: near 50 image misses per
second on an H200 host's CPU, each miss being ~17 ms of Python on one core, spread over
parsing, decoding, hashing, embedding, search and forwarding). The work of one request
does not split, so the front scales the way vLLM's own API server does: more processes.

- uvicorn's supervisor starts the workers (spawn) on one listening socket and replaces a
  worker that dies; each builds its front in :func:`app_from_env` from a private JSON spec
  (``$VLMCACHE_PROXY_CONFIG``, 0600 in a 0700 run directory; no salt in it).
- Every worker claims a slot directory ``<store>/proxy-workers/w<k>`` (an ``flock`` held
  for its life) for the front's own files (exact records, similarity indexes, canonical
  images): one writer per file, and a replaced worker takes over its predecessor's files.
  The budgets in the config are per worker.
- All workers use the deployment salt of the configured store, so a tenant's identities
  are the same whichever worker answers; their records (exact, image, paraphrase) and
  responses are shared through ``redis_url`` (required: without it each worker would see
  a fraction of the traffic and the hit rate would fall with N).
- ``/metrics`` adds up the workers (prometheus-client's multiprocess mode, files in the run
  directory); ``/vlmcache/routing`` is the answering worker's own counts, named by slot.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import shutil
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Mapping, MutableMapping, Sequence

import vlmcache.cpu_share as cpu_share
from vlmcache.config import VlmCacheConfig
from vlmcache.errors import ConfigError
from vlmcache.tenant_secret import (deployment_salt, ensure_private_dir, public_config,
                                    with_deployment_salt, write_private_file)

logger = logging.getLogger(__name__)

SPEC_ENV = "VLMCACHE_PROXY_CONFIG"
MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
WORKERS_DIR = "proxy-workers"


@dataclass(frozen=True)
class ProxySpec:
    """What every worker builds its front and upstream app from (no secret in it)."""

    model: str
    config: dict[str, Any]
    media_io_kwargs: dict[str, dict[str, Any]]
    upstreams: list[str]
    routing: str | None

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1)

    @classmethod
    def from_json(cls, text: str) -> "ProxySpec":
        raw = json.loads(text)
        if not isinstance(raw, dict) or not isinstance(raw.get("model"), str) or not \
                isinstance(raw.get("upstreams"), list) or not raw["upstreams"]:
            raise ValueError("expected {\"model\": DIR, \"upstreams\": [URL, ...], ...}")
        return cls(raw["model"], dict(raw.get("config") or {}),
                   dict(raw.get("media_io_kwargs") or {}),
                   [str(u) for u in raw["upstreams"]], raw.get("routing"))


@dataclass(frozen=True)
class WorkerSlot:
    """A worker's own directory; ``fd`` holds its lock until the process exits."""

    index: int
    path: Path
    fd: int


def check_workers(config: VlmCacheConfig) -> None:
    """``ConfigError`` unless ``proxy_workers`` > 1 comes with shared records in Redis."""
    if config.proxy_workers > 1 and not (config.redis_url and config.redis_share_records):
        raise ConfigError(
            f"proxy_workers: {config.proxy_workers} workers share their tiers through Redis: "
            "set redis_url (and keep redis_share_records on), or run one worker")


def claim_slot(store: Path, workers: int) -> WorkerSlot:
    """The first free ``<store>/proxy-workers/w<k>``, locked for this process's life.

    Slots past ``workers`` are used only while a replaced worker's predecessor still
    holds its lock (it is exiting)."""
    root = store / WORKERS_DIR
    ensure_private_dir(root, "proxy worker directory")
    for k in range(2 * workers):
        path = root / f"w{k}"
        ensure_private_dir(path, "proxy worker directory")
        fd = os.open(path / "lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            continue
        os.set_inheritable(fd, False)
        return WorkerSlot(k, path, fd)
    raise ConfigError(f"proxy_workers: all {2 * workers} worker directories under {root} are "
                      "locked: is another vlmcache proxy running on this store_path?")


def worker_config(base: VlmCacheConfig, slot: WorkerSlot) -> VlmCacheConfig:
    """``base`` with the deployment salt of its store, storing under ``slot``'s directory."""
    salted = with_deployment_salt(base)  # the base store's salt: the same in every worker
    return replace(salted, store_path=str(slot.path))


def prepare_run(config: VlmCacheConfig, spec: ProxySpec) -> Path:
    """Write the workers' spec, make the metrics directory and point the environment (which
    the spawned workers inherit) at both; returns the run directory to remove at the end."""
    deployment_salt(config)  # the store and its salt file, before the workers race for them
    root = config.store_dir / WORKERS_DIR
    ensure_private_dir(root, "proxy worker directory")
    run_dir = root / f"run-{os.getpid()}"
    if run_dir.exists():  # a previous process of this pid died: nothing of it is live
        shutil.rmtree(run_dir)
    ensure_private_dir(run_dir, "proxy run directory")
    metrics_dir = run_dir / "metrics"
    ensure_private_dir(metrics_dir, "proxy metrics directory")
    os.environ[SPEC_ENV] = str(write_private_file(run_dir, "proxy.json", spec.to_json()))
    os.environ[MULTIPROC_ENV] = str(metrics_dir)
    return run_dir


def run_workers(model: str, config: VlmCacheConfig, media_io: Mapping[str, Any],
                upstreams: Sequence[str], routing: str | None, host: str, port: int) -> None:
    """Serve ``config.proxy_workers`` front processes on ``host:port`` until stopped."""
    import uvicorn

    check_workers(config)
    from vlmcache.vllm.namespace import namespace_for_model

    # what every worker's front needs of the model (its weights' identity, its files):
    # a bad model or config stops here with its message, not in N restarting workers
    namespace_for_model(model, with_deployment_salt(config))
    spec = ProxySpec(model, public_config(config), {k: dict(v) for k, v in media_io.items()},
                     list(upstreams), routing)
    run_dir = prepare_run(config, spec)
    threads = share_cpus(config.proxy_workers, os.environ,
                         cpu_share.plan(config.engine_cpus, config.front_thread_nice))
    logger.info("vlmcache proxy: %d workers on %s:%d, sharing through Redis; %s CPU "
                "threads each for their embedders", config.proxy_workers, host, port, threads)
    try:
        uvicorn.run(f"{__name__}:app_from_env", factory=True, workers=config.proxy_workers,
                    host=host, port=port, log_level="warning")
    finally:
        shutil.rmtree(run_dir, ignore_errors=True)


THREAD_ENVS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def share_cpus(workers: int, env: MutableMapping[str, str], share: cpu_share.CpuShare) -> str:
    """Set the workers' OpenMP / MKL threads (read by torch at import) to the front's CPUs
    (``share``: the host's, less those left to vLLM) shared out among them, unless the
    operator set them. Left alone, every worker's embedder (MiniLM) starts one thread per
    core: N workers embedding at once oversubscribe the host N times over. Returns the
    value the workers get."""
    if env.get(THREAD_ENVS[0]):
        return env[THREAD_ENVS[0]]
    threads = str(max(1, share.count // max(1, workers)))
    for name in THREAD_ENVS:
        env.setdefault(name, threads)
    return threads


def app_from_env() -> Any:
    """One worker's ASGI app (uvicorn's factory): its slot, its front, the shared metrics."""
    from vlmcache.serving.front import CascadeFront
    from vlmcache.serving.metrics import FrontMetrics
    from vlmcache.serving.proxy import build_proxy_app
    from vlmcache.vllm.logs import LOGGER

    logging.basicConfig(level=logging.WARNING)
    logging.getLogger(LOGGER).setLevel(logging.INFO)
    spec = _read_spec()
    base = VlmCacheConfig.from_dict(spec.config)
    slot = claim_slot(base.store_dir, base.proxy_workers)
    config = worker_config(base, slot)
    # the whole worker (its event loop, torch's threads) off the CPUs left to vLLM
    cpu_share.pin_process(cpu_share.plan(config.engine_cpus, config.front_thread_nice))
    front = CascadeFront.for_model(spec.model, config, metrics=FrontMetrics.create(
        tenant_label=config.metrics_tenant_label), media_io_kwargs=spec.media_io_kwargs,
        own_process=True)
    atexit.register(front.close)
    logger.info("vlmcache proxy worker %d (pid %d): files in %s", slot.index, os.getpid(),
                slot.path)
    return build_proxy_app(front, spec.upstreams, routing=spec.routing,
                           registry=_multiprocess_registry(), worker=slot.index)


def _read_spec() -> ProxySpec:
    path = os.environ.get(SPEC_ENV)
    if not path:
        raise ConfigError(f"{SPEC_ENV} is not set: start the workers with "
                          "`vlmcache proxy --workers N`")
    try:
        return ProxySpec.from_json(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{SPEC_ENV}: cannot read {path}: {exc}") from None


def _multiprocess_registry() -> Any:
    """A registry that adds up every worker's collectors (``None``: not in multiprocess
    mode, the default registry serves). Live gauges of workers no longer running (one
    killed and replaced) are dropped first, and this worker's at its exit."""
    directory = os.environ.get(MULTIPROC_ENV)
    if not directory:
        return None
    from prometheus_client import CollectorRegistry, multiprocess

    for pid in dead_worker_pids(Path(directory)):
        multiprocess.mark_process_dead(pid, directory)
    atexit.register(multiprocess.mark_process_dead, os.getpid(), directory)
    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    return registry


def dead_worker_pids(directory: Path) -> list[int]:
    """Pids with live-gauge files in ``directory`` whose process is gone."""
    pids = set()
    for path in directory.glob("gauge_live*_*.db"):
        try:
            pids.add(int(path.stem.rsplit("_", 1)[1]))
        except ValueError:
            continue
    return sorted(pid for pid in pids if not _alive(pid))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
