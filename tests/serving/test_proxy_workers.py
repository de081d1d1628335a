"""`vlmcache proxy --workers N`: front processes on one port, sharing tiers through Redis."""

from __future__ import annotations

import asyncio
import fcntl
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fakes import FakeEngineApp, chat, data_url, image, serving  # noqa: E402

from vlmcache.config import VlmCacheConfig  # noqa: E402
from vlmcache.errors import ConfigError  # noqa: E402
from vlmcache.serving.front import CascadeFront  # noqa: E402
from vlmcache.serving.proxy import build_proxy_app  # noqa: E402
from vlmcache.serving.proxy_workers import (WORKERS_DIR, ProxySpec, check_workers,  # noqa: E402
                                            claim_slot, worker_config)
from vlmcache.testing.redis_fixtures import live_redis, redis_server  # noqa: E402,F401
from vlmcache.testing.server import free_port  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def engine():
    # an engine's time to answer: a call the front starts before its cascade decides is
    # dropped (aborted) well before it answers, as on a real engine
    app = FakeEngineApp(latency_s=0.3)
    with serving(app) as url:
        yield url, app


def test_more_than_one_worker_needs_shared_records_in_redis(tmp_path):
    check_workers(VlmCacheConfig(store_path=str(tmp_path)))  # one worker: nothing needed
    with pytest.raises(ConfigError, match="redis_url"):
        check_workers(VlmCacheConfig(store_path=str(tmp_path), proxy_workers=2))
    with pytest.raises(ConfigError, match="redis_share_records"):
        check_workers(VlmCacheConfig(store_path=str(tmp_path), proxy_workers=2,
                                     redis_url="redis://127.0.0.1:1/0",
                                     redis_share_records=False))
    (tmp_path / "m").mkdir()
    proc = subprocess.run([sys.executable, "-m", "vlmcache.cli", "proxy", str(tmp_path / "m"),
                           "--upstream", "http://127.0.0.1:9", "--workers", "2",
                           "--vlmcache-set", f"store_path={tmp_path / 's'}"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "redis_url" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "vlmcache.cli", "proxy", str(tmp_path / "m"),
                           "--upstream", "http://127.0.0.1:9", "--workers", "2",
                           "--vlmcache-set", f"store_path={tmp_path / 's'}",
                           "--vlmcache-set", "redis_url=redis://127.0.0.1:9/0"],
                          capture_output=True, text=True, timeout=120)
    # a model directory without weights or model_revision: said once, before any worker
    assert proc.returncode != 0 and "model_revision" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and "proxy-workers" not in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "vlmcache.cli", "proxy", str(tmp_path / "m"),
                           "--upstream", "http://127.0.0.1:9", "--workers", "0"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and "proxy_workers" in proc.stderr and "[1, 256]" in proc.stderr


def test_each_worker_claims_its_own_private_directory(tmp_path):
    first, second = claim_slot(tmp_path, 2), claim_slot(tmp_path, 2)
    assert (first.index, second.index) == (0, 1)
    assert first.path == tmp_path / WORKERS_DIR / "w0"
    assert oct(first.path.stat().st_mode & 0o777) == "0o700"
    os.close(first.fd)  # the worker died: its successor takes its files over
    assert claim_slot(tmp_path, 2).index == 0
    third = claim_slot(tmp_path, 2)  # its predecessor still exiting: a spare slot
    assert third.index == 2
    claim_slot(tmp_path, 2)
    with pytest.raises(ConfigError, match="another vlmcache proxy"):
        claim_slot(tmp_path, 2)


def test_workers_use_the_base_stores_salt(tmp_path):
    base = VlmCacheConfig(store_path=str(tmp_path / "s"))
    a = worker_config(base, claim_slot(base.store_dir, 2))
    b = worker_config(base, claim_slot(base.store_dir, 2))
    assert a.tenant_salt and a.tenant_salt == b.tenant_salt
    assert a.store_dir != b.store_dir and a.store_dir.parent == base.store_dir / WORKERS_DIR


def test_spec_round_trips_and_refuses_a_spec_without_upstreams():
    spec = ProxySpec("/m", {"redis_url": "redis://h:1/0"}, {"video": {"num_frames": 8}},
                     ["http://a:1"], "affinity")
    assert ProxySpec.from_json(spec.to_json()) == spec
    with pytest.raises(ValueError, match="upstreams"):
        ProxySpec.from_json('{"model": "/m", "upstreams": []}')


def _worker_app(tmp_path, redis_url, upstream):
    (tmp_path / "m").mkdir(exist_ok=True)
    base = VlmCacheConfig(store_path=str(tmp_path / "s"), model_revision="t",
                          enable_image_embedding=True, redis_url=redis_url,
                          redis_sync_interval_s=0.1, proxy_workers=2)
    slot = claim_slot(base.store_dir, 2)
    front = CascadeFront.for_model(str(tmp_path / "m"), worker_config(base, slot),
                                   metrics=None)
    return build_proxy_app(front, [upstream], worker=slot.index), front


def test_what_one_worker_learns_the_other_answers_from(tmp_path, live_redis, engine):
    upstream, fake = engine
    (app_a, front_a), (app_b, front_b) = (_worker_app(tmp_path, live_redis.url, upstream)
                                          for _ in range(2))
    im = image(5, size=64)
    jpeg = chat("Other?", tenant="A")
    jpeg["messages"][0]["content"].insert(0, {"type": "image_url", "image_url": {
        "url": data_url(im, "JPEG", quality=90)}})

    async def go():
        ta, tb = httpx.ASGITransport(app=app_a), httpx.ASGITransport(app=app_b)
        async with httpx.AsyncClient(transport=ta, base_url="http://a") as a, \
                httpx.AsyncClient(transport=tb, base_url="http://b") as b:
            first = (await a.post("/v1/chat/completions", json=chat("Q?", im, tenant="A")))
            replicator = front_b.cascade.image.replicator
            deadline = time.monotonic() + 20
            while replicator.stats().applied < 2:  # A's exact and image records, on the log
                assert time.monotonic() < deadline, replicator.stats()
                await asyncio.sleep(0.1)
            again = (await b.post("/v1/chat/completions", json=jpeg)).json()
            repeat = (await b.post("/v1/chat/completions", json=chat("Q?", im, tenant="A")))
            routing = [(await c.get("/vlmcache/routing")).json()["worker"] for c in (a, b)]
            return first.json(), again, repeat.json(), routing

    try:
        first, again, repeat, routing = asyncio.run(go())
    finally:
        front_a.close()
        front_b.close()
    assert first["vlmcache"]["statuses"]["embedding:vision"] == "miss"
    assert again["vlmcache"]["statuses"]["embedding:vision"] == "hit"
    assert repeat["vlmcache"]["hit_tier"] == "response"  # worker A's answer, through Redis
    assert routing == [0, 1]
    uuids = {b["messages"][0]["content"][0]["uuid"] for b in fake.bodies}
    assert len(uuids) == 1  # both workers name the image alike (one salt)


def _locked(path: Path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def test_proxy_with_two_workers_serves_the_openai_client(tmp_path, live_redis, engine):
    openai = pytest.importorskip("openai")
    upstream, fake = engine
    (tmp_path / "m").mkdir()
    store, port = tmp_path / "s", free_port()
    sets = {"store_path": store, "model_revision": "t", "redis_url": live_redis.url,
            "redis_sync_interval_s": 0.1}
    proc = subprocess.Popen(
        [sys.executable, "-m", "vlmcache.cli", "proxy", str(tmp_path / "m"), "--upstream",
         upstream, "--port", str(port), "--workers", "2",
         *[a for k, v in sets.items() for a in ("--vlmcache-set", f"{k}={v}")]],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    slots = [store / WORKERS_DIR / f"w{k}" / "lock" for k in range(2)]
    try:
        deadline = time.monotonic() + 90
        while not all(p.exists() and _locked(p) for p in slots):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
            time.sleep(0.2)
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/metrics").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline
            time.sleep(0.2)
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="x",
                               max_retries=0)
        messages = chat("Q?", image(3), tenant="A")["messages"]
        answers = []
        for _ in range(12):  # which worker takes a connection is the kernel's choice: the
            # sharing between workers is the test above's
            r = client.chat.completions.with_raw_response.create(
                model="m", messages=messages, temperature=0, extra_body={"cache_salt": "A"})
            answers.append(r.parse().choices[0].message.content)
        assert len(set(answers)) == 1 and len(fake.bodies) == 1  # the rest: response tier
        metrics = httpx.get(f"http://127.0.0.1:{port}/metrics").text
        served = [line for line in metrics.splitlines()
                  if line.startswith("vlmcache_front_requests_total")]
        assert sum(float(line.rsplit(" ", 1)[1]) for line in served) == 12, served
        run_dirs = list((store / WORKERS_DIR).glob("run-*"))
        assert len(run_dirs) == 1 and oct(run_dirs[0].stat().st_mode & 0o777) == "0o700"
    finally:
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=30)[0]
    assert proc.returncode == 0, out
    assert not list((store / WORKERS_DIR).glob("run-*"))  # the run directory is removed



def test_a_dead_workers_live_gauges_are_found(tmp_path):
    from vlmcache.serving.proxy_workers import dead_worker_pids

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True).stdout.strip()
    for name in (f"gauge_livesum_{dead}.db", f"gauge_livesum_{os.getpid()}.db",
                 f"counter_{dead}.db", "gauge_livesum_x.db"):
        (tmp_path / name).write_bytes(b"")
    assert dead_worker_pids(tmp_path) == [int(dead)]


def test_workers_share_the_hosts_cpus_for_their_embedders():
    from vlmcache.cpu_share import plan
    from vlmcache.serving.proxy_workers import share_cpus

    host = frozenset(range(16))
    env: dict[str, str] = {}
    assert share_cpus(8, env, plan(0, 0, host)) == "2"
    assert env == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2"}
    env = {}  # 4 CPUs left to vLLM: the workers share the other 12
    assert share_cpus(4, env, plan(4, 5, host)) == "3"
    env = {}
    assert share_cpus(32, env, plan(4, 5, host)) == "1"  # never 0
    env = {"OMP_NUM_THREADS": "6"}  # the operator's choice stands
    assert share_cpus(8, env, plan(4, 5, host)) == "6" and env == {"OMP_NUM_THREADS": "6"}
