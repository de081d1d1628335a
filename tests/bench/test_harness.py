import argparse
import json

import pytest

from vlmcache.bench.harness import (
    BUILTIN_MODEL,
    BenchSpec,
    build_requests,
    engine_args,
    normalize_text,
    prompt_format,
)
from vlmcache.bench.modes import MODES, TIER_SWITCHES, parse_modes
from vlmcache.bench.run import add_arguments, spec_from_args
from vlmcache.errors import ConfigError


def _args(*argv):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    return parser.parse_args(list(argv))


def test_spec_round_trips_through_json():
    spec = BenchSpec(dataset="x.jsonl", workloads=("zipf", "restart"), n=7,
                     engine={"max_model_len": 1024})
    assert BenchSpec.from_json(spec.to_json()) == spec


def test_parse_modes_names_the_allowed_ones():
    assert parse_modes("all", gpu=True) == tuple(MODES)
    # vLLM's CPU offloading refuses non-GPU platforms: "all" on a CPU install leaves it out
    assert parse_modes("all", gpu=False) == tuple(m for m in MODES if m != "native_offload")
    assert parse_modes("native_offload", gpu=False) == ("native_offload",)  # asked by name
    assert parse_modes("no_cache, vlmcache:all,no_cache") == ("no_cache", "vlmcache:all")
    with pytest.raises(ConfigError, match="allowed: no_cache, prefix_cache"):
        parse_modes("no_cache,fast")


def test_each_tier_mode_turns_on_only_its_tiers():
    image = MODES["vlmcache:image"].config_overrides()
    assert image["enable_image_embedding"] and not any(
        v for k, v in image.items() if k != "enable_image_embedding")
    assert all(MODES["vlmcache:all"].config_overrides()[s] for s in TIER_SWITCHES)
    assert not MODES["prefix_cache"].vlmcache and MODES["vlmcache:kv"].vlmcache


def test_engine_args_differ_only_by_the_mode():
    spec = BenchSpec(offload_gib=2.0)
    base = engine_args(spec, MODES["no_cache"])
    native = engine_args(spec, MODES["native_offload"])
    assert base["enable_prefix_caching"] is False and native["enable_prefix_caching"] is True
    assert native["kv_offloading_size"] == 2.0
    assert {k: v for k, v in native.items() if k not in ("enable_prefix_caching",
                                                          "kv_offloading_size")} == \
        {k: v for k, v in base.items() if k != "enable_prefix_caching"}


def test_bad_options_get_clear_errors():
    with pytest.raises(ConfigError, match="--prompt-template is required"):
        spec_from_args(_args("--model", "/models/llava"), "/tmp/s")
    with pytest.raises(ConfigError, match="must contain {question}"):
        spec_from_args(_args("--model", "/m", "--prompt-template", "USER: <image>"), "/tmp/s")
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        spec_from_args(_args("--engine-arg", "max_model_len"), "/tmp/s")
    with pytest.raises(ConfigError, match="--n"):
        spec_from_args(_args("--n", "0"), "/tmp/s")
    spec = spec_from_args(_args("--engine-arg", "max_model_len=1024", "--workloads",
                                "zipf,restart"), "/tmp/s")
    assert spec.engine == {"max_model_len": 1024} and spec.workloads == ("zipf", "restart")


def test_user_prompt_template_and_answer_normalization():
    spec = BenchSpec(model="/m", prompt_template="USER: <image>\n{question} ASSISTANT:")
    make, norm = prompt_format(spec)
    assert make("what is it?") == "USER: <image>\nwhat is it? ASSISTANT:"
    assert norm(" A red Circle.\n") == "red circle"
    assert normalize_text("The answer: yes!") == "answer yes"
    with pytest.raises(ValueError, match="prompt-template"):
        prompt_format(BenchSpec(model="/m"))
    assert prompt_format(BenchSpec(model=BUILTIN_MODEL))[0]("q").count("<image>") == 1


def test_requests_rebuild_identically_from_a_jsonl_dataset(tmp_path):
    from PIL import Image

    lines = []
    for i in range(6):
        Image.new("RGB", (16, 16), (i * 40, 0, 0)).save(tmp_path / f"{i}.png")
        lines.append(json.dumps({"image": f"{i}.png", "question": f"q{i}?", "answer": "a"}))
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    spec = BenchSpec(dataset=str(tmp_path / "d.jsonl"), n=30, workloads=("zipf", "restart"))
    first, again = build_requests(spec), build_requests(BenchSpec.from_json(spec.to_json()))
    assert first == again and len(first) == 30
    assert sum(r.restart_before for r in first) == 1


@pytest.mark.vllm
def test_bench_cli_runs_modes_side_by_side(tmp_path):
    """The newcomer's command, small: the cache survives the restart, answers agree."""
    from vlmcache.cli import main

    out = tmp_path / "bench"
    code = main(["bench", "--n", "15", "--limit", "40", "--modes", "no_cache,vlmcache:all",
                 "--workloads", "zipf,paraphrase,restart", "--out", str(out)])
    assert code == 0
    record = json.loads((out / "results.json").read_text())
    modes = record["summary"]["modes"]
    assert set(modes) == {"no_cache", "vlmcache:all"}
    assert modes["no_cache"]["reuse_rate"] == 0
    assert all(m["ttft_p50_ms"] > 0 for m in modes.values())  # vLLM timed every request
    assert modes["vlmcache:all"]["reuse_rate"] >= 0.3
    assert modes["vlmcache:all"]["agreement"] >= 0.8
    rows = [json.loads(line) for line in (out / "rows-vlmcache-all.jsonl").open()]
    restarted = [r for r in rows if r["after_restart"]]
    assert len(restarted) == 1 and restarted[0]["tokens_loaded"] > 0  # from the store
    assert (out / "plot.png").stat().st_size > 10_000
    assert "vlmcache:all" in (out / "summary.md").read_text()
    assert len((out / "requests.log").read_text().splitlines()) == 30
