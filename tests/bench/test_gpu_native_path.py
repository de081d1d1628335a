"""The GPU benchmark's result file (no GPU)."""

import json


def test_invocations_for_one_shape_merge_their_modes_and_keep_each_command(tmp_path):
    import argparse

    from vlmcache.bench.gpu_native_path import _write

    out = tmp_path / "r.json"
    args = argparse.Namespace(geometry="benchmarks/geometries/qwen2vl7b", out=str(out),
                              compile=False, n=12, batch=32, cpu_bytes=1, block_size=16)
    _write(args, ["--modes", "vllm"], {"vllm": {"miss": {"median_ms": 50.0}}})
    _write(args, ["--modes", "vlmcache"], {"vlmcache": {"miss": {"median_ms": 51.0}}})
    record = json.loads(out.read_text())
    assert set(record["modes"]["qwen2vl7b"]) == {"vllm", "vlmcache"}
    assert record["shapes"]["qwen2vl7b"]["targets"]["miss_le_1.05x_recompute"] is True
    assert len(record["commands"]["qwen2vl7b"]) == 2 and "--modes vlmcache" in record["command"]
