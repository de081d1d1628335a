"""The GPU benchmark's result file and mode names (no GPU)."""

import argparse
import os
import json

import pytest

from vlmcache_lab.gpu_native_path import _child_args, _mode


def test_invocations_for_one_shape_merge_their_modes_and_keep_each_command(tmp_path):
    from vlmcache_lab.gpu_native_path import _write

    out = tmp_path / "r.json"
    args = argparse.Namespace(geometry="benchmarks/geometries/qwen2vl7b", out=str(out),
                              eager=False, n=12, batch=32, cpu_bytes=1, block_size=16,
                              admission_memory="always", batch_repeats=3)
    _write(args, ["--modes", "vllm"], {"vllm": {"miss": {"median_ms": 50.0}}})
    _write(args, ["--modes", "vlmcache"], {"vlmcache": {"miss": {"median_ms": 51.0}}})
    record = json.loads(out.read_text())
    assert set(record["modes"]["qwen2vl7b"]) == {"vllm", "vlmcache"}
    assert record["shapes"]["qwen2vl7b"]["targets"]["miss_le_1.05x_recompute"] is True
    assert len(record["commands"]["qwen2vl7b"]) == 2 and "--modes vlmcache" in record["command"]


def test_merge_joins_the_result_files_of_several_calls(tmp_path):
    from vlmcache_lab.gpu_native_path import main

    parts = []
    for i, (shape, modes) in enumerate([
            ("qwen2vl7b", {"vllm": {"miss": {"median_ms": 50.0, "all_ms": [50.0]}}}),
            ("qwen2vl7b", {"vlmcache": {"miss": {"median_ms": 51.0}}}),
            ("llava7b", {"vllm": {"miss": {"median_ms": 40.0, "all_ms": [40.0]}}})]):
        part = tmp_path / f"{i}.json"
        part.write_text(json.dumps({"device": "H100", "modes": {shape: modes},
                                    "commands": {shape: [f"cmd{i}"]}, "n_batch1": 24,
                                    "batch": 32, "cpu_bytes": 1}))
        parts.append(str(part))
    out = tmp_path / "all.json"
    main(["--merge", *parts, "--out", str(out)])
    record = json.loads(out.read_text())
    assert set(record["modes"]["qwen2vl7b"]) == {"vllm", "vlmcache"}
    assert record["commands"] == {"qwen2vl7b": ["cmd0", "cmd1"], "llava7b": ["cmd2"]}
    assert record["shapes"]["qwen2vl7b"]["targets"]["miss_le_1.05x_recompute"] is True
    assert record["shapes"]["llava7b"]["recompute_ms"] == 40.0 and record["device"] == "H100"


def test_modes_take_an_admission_variant_and_unknown_names_are_refused():
    assert _mode("vlmcache_restart@second_sight") == "vlmcache_restart@second_sight"
    with pytest.raises(argparse.ArgumentTypeError, match="vlmcache modes also @always"):
        _mode("vllm@second_sight")
    assert _mode("vlmcache@memory") == "vlmcache@memory"
    with pytest.raises(argparse.ArgumentTypeError, match="@always, @second_sight, @memory"):
        _mode("vlmcache@sometimes")
    with pytest.raises(argparse.ArgumentTypeError, match="unknown mode 'vlm'"):
        _mode("vlm")


def test_only_the_phases_asked_for_are_profiled(tmp_path):
    from vlmcache_lab.phase_timing import PhaseProfile

    args = argparse.Namespace(profile_dir=str(tmp_path), profile_phases="gpu_hit_again",
                              profile_native=True)
    assert PhaseProfile(args, "vllm-miss", "miss").path is None
    picked = PhaseProfile(args, "vllm-gpu_hit_again", "gpu_hit_again")
    assert picked.path == tmp_path / "vllm-gpu_hit_again.txt" and picked.native


def test_a_layout_variant_sets_vllms_order_or_vlmcaches_block_layout(tmp_path):
    from vlmcache_lab import gpu_native_path

    assert _mode("vllm@hnd") == "vllm@hnd" and _mode("vlmcache@per_layer")
    with pytest.raises(argparse.ArgumentTypeError, match="vlmcache modes also"):
        _mode("vllm@per_layer")
    args = argparse.Namespace(store="/s", kv_block_layout="cross_layer")
    assert gpu_native_path._child_args("vllm@hnd", args) == "vllm" and args.store == "/s-hnd"
    args = argparse.Namespace(store="/s", kv_block_layout="cross_layer")
    assert gpu_native_path._child_args("vlmcache@per_layer", args) == "vlmcache"
    assert args.kv_block_layout == "per_layer" and args.store == "/s-per_layer"


def test_a_repeat_runs_its_mode_on_a_store_of_its_own_shared_with_its_restart():
    assert _mode("vlmcache_restart@always#2") == "vlmcache_restart@always#2"
    with pytest.raises(argparse.ArgumentTypeError, match="a repeat is #2"):
        _mode("vllm#1")
    with pytest.raises(argparse.ArgumentTypeError, match="a repeat is #2"):
        _mode("vllm#x")
    stores = {}
    for name in ("vlmcache#2", "vlmcache_restart#2", "vlmcache@always#3", "vllm",
                 "vlmcache@memory", "vlmcache@tight"):
        args = argparse.Namespace(store="/w/store", admission_memory="second_sight",
                                  disk_bytes=50, stack_room=True)
        stores[name] = (_child_args(name, args), args.store, args.admission_memory)
        assert args.disk_bytes == (0 if name.endswith("@memory") else 50)
        assert args.stack_room is not name.endswith("@tight")
    assert stores["vlmcache#2"] == ("vlmcache", "/w/store-r2", "second_sight")
    assert stores["vlmcache_restart#2"][1] == "/w/store-r2"
    assert stores["vlmcache@always#3"] == ("vlmcache", "/w/store-always-r3", "always")
    assert stores["vllm"] == ("vllm", "/w/store", "second_sight")
    assert stores["vlmcache@memory"] == ("vlmcache", "/w/store-memory", "second_sight")
    assert stores["vlmcache@tight"] == ("vlmcache", "/w/store-tight", "second_sight")
    with pytest.raises(argparse.ArgumentTypeError, match="vlmcache modes also"):
        _mode("vllm@tight")


class _Runner:
    """Records the phases ``run_mode`` drives, in order."""

    calls: list[str] = []
    params2 = None

    def __init__(self, mode, args, turns):
        _Runner.calls = []

    def generate(self, seeds, params=None):
        self.calls.append("generate")
        return []

    def timed(self, seeds):
        self.calls.append("timed")
        return {}

    def batched(self, seeds):
        self.calls.append("batched")
        return {}

    def reset_gpu_cache(self, settle_s):
        self.calls.append("reset")

    def close(self):
        pass


def _phases(monkeypatch, mode, admission):
    from vlmcache_lab import gpu_native_path

    monkeypatch.setattr(gpu_native_path, "Runner", _Runner)
    args = argparse.Namespace(n=2, batch=2, settle=0.0, profile_dir="", profile_phases="",
                              profile_native=False, admission_memory=admission, turns="", child=None,
                              batch_repeats=2)
    phases = list(gpu_native_path.run_mode(mode, args))
    # the plan a turn server aligns phases by is what the mode runs
    assert gpu_native_path.phase_plan(mode, args) == phases
    calls = _Runner.calls[1:]  # after the warm-up batch
    return phases, calls[calls.index("timed"):]


def test_under_second_sight_cpu_hits_follow_a_second_computation(monkeypatch):
    phases, calls = _phases(monkeypatch, "vlmcache", "second_sight")
    assert phases == ["miss", "gpu_hit", "gpu_hit_again", "miss_batch", "miss_again",
                      "cpu_hit", "miss_again_batch", "cpu_hit_batch", "miss_batch_2"]
    # prompts computed once, evicted, computed again (captured), then hit in the CPU tier;
    # each CPU-hit phase comes right after its own prompts' capture; the repeated first-sight
    # batch comes last, where what it captures evicts nothing timed
    assert calls == ["timed", "timed", "timed", "batched", "generate", "reset", "timed",
                     "reset", "timed", "batched", "reset", "batched", "batched"]


def test_capture_at_first_sight_times_cpu_hits_after_one_reset(monkeypatch):
    phases, calls = _phases(monkeypatch, "native_cpu", "second_sight")
    assert phases == ["miss", "gpu_hit", "gpu_hit_again", "miss_batch", "cpu_hit",
                      "cpu_hit_batch", "miss_batch_2"]
    assert calls == ["timed", "timed", "timed", "batched", "reset", "timed", "reset",
                     "batched", "batched"]


def test_groups_run_at_once_but_a_restart_comes_after_its_capture():
    import pytest

    from vlmcache_lab.gpu_native_path import _groups

    assert _groups("vllm+vlmcache,native_cpu,vlmcache_restart+native_tiering_restart") == [
        ["vllm", "vlmcache"], ["native_cpu"], ["vlmcache_restart", "native_tiering_restart"]]
    with pytest.raises(SystemExit, match="reads what vlmcache stores"):
        _groups("vlmcache+vlmcache_restart")
    with pytest.raises(SystemExit, match="named twice"):
        _groups("vllm+vlmcache,vllm")


def test_an_environment_variant_starts_its_mode_with_that_environment(tmp_path, monkeypatch):
    """``vllm@hnd`` / ``vlmcache@malloc``: set before the mode's interpreter starts (CPython
    reads PYTHONMALLOC only then)."""
    from vlmcache_lab import mode_procs

    seen = {}

    class _Popen:
        pid = 0

        def __init__(self, cmd, env, **kwargs):
            seen[cmd[cmd.index("--child") + 1]] = env

    monkeypatch.setattr(mode_procs.subprocess, "Popen", _Popen)
    monkeypatch.setattr(mode_procs, "_RUNNING", [])
    args = argparse.Namespace(work=str(tmp_path))
    for mode in ("vlmcache@malloc#2", "vllm@hnd", "vllm"):
        mode_procs._start(mode, args, [])
    assert seen["vlmcache@malloc#2"]["PYTHONMALLOC"] == "malloc"
    assert seen["vllm@hnd"]["VLLM_KV_CACHE_LAYOUT"] == "HND"
    assert "PYTHONMALLOC" not in seen["vllm"] or os.environ.get("PYTHONMALLOC")
    assert all(env["PYTHONHASHSEED"] == "0" for env in seen.values())


def test_a_run_starts_on_empty_stores_and_never_wipes_one_given_by_name(tmp_path):
    from vlmcache_lab.gpu_native_path import _clear_stores, _require_empty

    work = tmp_path / "work"
    for name in ("store", "store-memory", "store-fs"):  # an earlier run's rows
        (work / name / "kv").mkdir(parents=True)
        (work / name / "kv" / "row").write_bytes(b"x")
    (work / "engine.log").write_text("kept")
    _clear_stores(work / "store")
    assert sorted(p.name for p in work.iterdir()) == ["engine.log"]

    given = tmp_path / "mine"
    (given / "kv").mkdir(parents=True)
    with pytest.raises(SystemExit, match="is not empty"):
        _require_empty(given)
    assert (given / "kv").is_dir()
    _require_empty(tmp_path / "new")  # nothing there yet: fine
