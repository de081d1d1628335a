"""``vlmcache bench --workload video``: the trace, its spec and engine settings, the token
table (no engine)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from vlmcache.bench.harness import (BUILTIN_MODEL, BenchSpec, build_requests, cache_config,
                                    engine_args, prompt_format)
from vlmcache.bench.modes import MODES
from vlmcache.bench.run import add_arguments, spec_from_args
from vlmcache.bench.summary import summarize_run, token_table
from vlmcache.bench.types import RequestResult
from vlmcache.bench.video import (BUILTIN_VIDEO_MODEL, KINDS, ClipRef, build_video_requests)
from vlmcache.errors import ConfigError


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_the_trace_is_seeded_grouped_by_clip_and_exactly_n_long():
    reqs = build_video_requests(16, seed=3, tenants=3)
    assert reqs == build_video_requests(16, seed=3, tenants=3)  # every process rebuilds it
    assert reqs != build_video_requests(16, seed=4, tenants=3)
    assert [r.index for r in reqs] == list(range(16))
    assert [r.workload for r in reqs] == [*KINDS, *KINDS, *KINDS[:2]]
    first, second = reqs[:7], reqs[7:14]
    assert first[0].clip.seed != second[0].clip.seed  # a new clip per group
    by_kind = {r.workload: r for r in first}
    assert by_kind["remux"].clip.codec in ("huffyuv", "png")
    assert by_kind["reencode"].clip.codec == "mp4v" and by_kind["changed"].clip.changed
    assert by_kind["follow_up"].question != by_kind["first"].question
    # the tenant kind cycles over the other tenants; tenant-0 asks everything else
    assert (first[6].tenant, second[6].tenant) == ("tenant-1", "tenant-2")
    assert {r.tenant for r in reqs if r.workload != "tenant"} == {"tenant-0"}
    assert [r.expect_reuse for r in first] == [False, True, True, True, True, False, False]


def test_bad_trace_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="--tenants >= 2"):
        build_video_requests(7, 0, tenants=1)
    with pytest.raises(ConfigError, match="--n must be >= 1"):
        build_video_requests(0, 0)


def test_a_remux_carries_the_same_frames_and_a_changed_clip_only_its_last_frame():
    from vlmcache.testing.clips import decode_clip

    clip = ClipRef(5)
    ffv1 = decode_clip(clip.load())
    assert clip.load() == clip.load()  # byte-deterministic
    assert np.array_equal(decode_clip(ClipRef(5, "huffyuv").load()), ffv1)
    assert ClipRef(5, "huffyuv").load() != clip.load()
    changed = decode_clip(ClipRef(5, "ffv1", changed=True).load())
    assert np.array_equal(changed[:-1], ffv1[:-1]) and not np.array_equal(changed[-1], ffv1[-1])


def test_the_video_spec_uses_the_builtin_video_model_in_the_work_folder(tmp_path):
    spec = spec_from_args(_args("--workload", "video", "--n", "9"), str(tmp_path / "store"))
    assert (spec.workload, spec.model, spec.dataset) == ("video", BUILTIN_VIDEO_MODEL,
                                                         "synthetic-clips")
    assert spec.model_dir == str(tmp_path / "tiny-video")
    assert BenchSpec.from_json(spec.to_json()) == spec
    reqs = build_requests(spec)
    assert len(reqs) == 9 and reqs[0].medium_id == reqs[0].clip.id
    make, _ = prompt_format(spec)
    assert make("q?") == "USER: <video>\nq? ASSISTANT:"
    with pytest.raises(ConfigError, match="--dataset, --images and --workloads do not apply"):
        spec_from_args(_args("--workload", "video", "--workloads", "zipf"), str(tmp_path))
    assert spec_from_args(_args(), str(tmp_path)).workload == "image"  # the default


def test_video_engine_and_cache_settings(tmp_path):
    video = BenchSpec(workload="video", model=BUILTIN_VIDEO_MODEL, store_root=str(tmp_path))
    args = engine_args(video, MODES["prefix_cache"])
    assert args["limit_mm_per_prompt"] == {"video": 1} and args["block_size"] == 32
    assert args["media_io_kwargs"] == {"video": {"num_frames": 8}}
    assert args["max_model_len"] >= 8 * 64 + 64
    assert cache_config(video, MODES["vlmcache:all"]).enable_video_near_duplicates
    assert not cache_config(video, MODES["vlmcache:image"]).enable_video_near_duplicates
    image = BenchSpec(model=BUILTIN_MODEL, store_root=str(tmp_path))
    # image requests carry no videos: the tier stays off (the image bench is unchanged)
    assert not cache_config(image, MODES["vlmcache:all"]).enable_video_near_duplicates
    assert engine_args(image, MODES["prefix_cache"])["limit_mm_per_prompt"] == {"image": 1}


def _row(mode: str, index: int, workload: str, output: str = "a", **kw) -> RequestResult:
    values = {"mode": mode, "index": index, "workload": workload, "tenant": "tenant-0",
              "image_id": "clip1:ffv1", "question": "q", "answer_gt": None, "output": output,
              "latency_ms": 10.0, "ttft_ms": None, "prompt_tokens": 584, "tokens_loaded": 0,
              "tokens_prefix_cache": 0, "tokens_computed": 584, "hit_tier": None}
    return RequestResult(**{**values, **kw})


def test_the_token_table_says_where_tokens_came_from_per_kind_in_trace_order():
    base = [_row("no_cache", 0, "first"), _row("no_cache", 1, "repeat"),
            _row("no_cache", 2, "reencode")]
    cached = [_row("vlmcache:all", 0, "first"),
              _row("vlmcache:all", 1, "repeat", tokens_prefix_cache=576, tokens_computed=8),
              _row("vlmcache:all", 2, "reencode", output="b", tokens_loaded=512,
                   tokens_computed=72)]
    table = token_table(summarize_run({"no_cache": base, "vlmcache:all": cached}, {}), KINDS)
    lines = table.splitlines()
    assert lines[0].startswith("| mode | workload | n | tokens loaded | from prefix cache")
    assert "| vlmcache:all | repeat | 1 | 0 | 576 | 8 | 100.0% |" in table
    assert "| vlmcache:all | reencode | 1 | 512 | 0 | 72 | 0.0% |" in table
    kinds = [line.split(" | ")[1] for line in lines[2:5]]
    assert kinds == ["first", "repeat", "reencode"]  # the trace's order, not sorted
