"""Workload request streams: determinism, split of n, and each workload's shape."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from vlmcache.bench.types import Sample
from vlmcache.bench.workloads import (
    DEFAULT_WORKLOADS,
    FRAMES_PER_SEQUENCE,
    WORKLOADS,
    build_requests,
    default_paraphrase,
    describe,
    generic_paraphrase,
)
from vlmcache.errors import ConfigError


@pytest.fixture
def samples(tmp_path: Path) -> list[Sample]:
    """40 pairs over 20 gradient images (a shift changes their pixels)."""
    out = []
    ramp = np.arange(32, dtype=np.uint8) * 8
    for i in range(20):
        arr = np.stack([np.tile(ramp, (32, 1)), np.full((32, 32), i * 10, np.uint8),
                        np.tile(ramp[:, None], (1, 32))], axis=-1)
        path = tmp_path / f"img{i}.png"
        Image.fromarray(arr).save(path)
        out.append(Sample(path, f"what is in picture {i}?", f"thing {i}", f"img{i}"))
        out.append(Sample(path, "is there a red circle?", "no", f"img{i}"))
    return out


def _key(req):
    return (req.image.id, req.question, req.tenant)


def test_names_and_validation(samples):
    assert set(DEFAULT_WORKLOADS) == set(WORKLOADS) and DEFAULT_WORKLOADS[-1] == "restart"
    with pytest.raises(ConfigError, match="allowed: zipf, paraphrase, near_dup, tenants, restart"):
        build_requests(samples, ["zipf", "bogus"], 10, 0)
    with pytest.raises(ConfigError, match="more than once"):
        build_requests(samples, ["zipf", "zipf"], 10, 0)
    with pytest.raises(ConfigError):
        build_requests(samples, [], 10, 0)
    with pytest.raises(ConfigError, match="tenants"):
        build_requests(samples, ["tenants"], 10, 0, tenants=0)
    with pytest.raises(ConfigError, match="empty"):
        build_requests([], ["zipf"], 10, 0)
    with pytest.raises(ConfigError, match="n must be"):
        build_requests(samples, ["zipf"], -1, 0)


def test_deterministic_indexed_and_split(samples):
    a = build_requests(samples, DEFAULT_WORKLOADS, 103, seed=7)
    b = build_requests(list(samples), list(DEFAULT_WORKLOADS), 103, seed=7)
    c = build_requests(samples, DEFAULT_WORKLOADS, 103, seed=8)
    assert a == b
    assert a != c
    assert [r.index for r in a] == list(range(103))
    assert describe(a) == {"zipf": 21, "paraphrase": 21, "near_dup": 21, "tenants": 20,
                           "restart": 20}
    assert build_requests(samples, ["zipf"], 0, 0) == []


def test_block_independent_of_other_workloads(samples):
    alone = build_requests(samples, ["near_dup"], 12, seed=3)
    mixed = [r for r in build_requests(samples, ["zipf", "near_dup"], 24, seed=3)
             if r.workload == "near_dup"]
    assert [(r.image, r.question) for r in alone] == [(r.image, r.question) for r in mixed]


def test_zipf_skew_and_expect_reuse(samples):
    reqs = build_requests(samples, ["zipf"], 400, seed=1)
    counts = Counter((r.image.path, r.question) for r in reqs)
    assert counts.most_common(1)[0][1] > 3 * 400 / len(counts)  # well above uniform
    seen = set()
    for r in reqs:
        key = (r.image.path, r.question)
        assert r.expect_reuse == (key in seen) and r.tenant is None and not r.restart_before
        seen.add(key)
    assert sum(not r.expect_reuse for r in reqs) == len(counts)


def test_paraphrase_original_then_rewordings(samples):
    reqs = build_requests(samples, ["paraphrase"], 9, seed=0)
    for group in (reqs[0:3], reqs[3:6], reqs[6:9]):
        original, *rewordings = group
        assert not original.expect_reuse and original.meaning == ""
        for r in rewordings:
            assert r.expect_reuse and r.meaning == original.question
            assert r.question != original.question and r.answer == original.answer
            assert r.image == original.image
        assert rewordings[0].question != rewordings[1].question


def test_paraphrasers():
    assert default_paraphrase("is there a red shape?", 0) == "Is there any red shape in the picture?"
    assert default_paraphrase("what is on the table?", 1) == generic_paraphrase(
        "what is on the table?", 1)
    assert "what is on the table?" in generic_paraphrase("what is on the table?", 0)


def test_custom_paraphraser_and_fallback(samples):
    calls = []

    def custom(question: str, variant: int) -> str | None:
        calls.append(variant)
        return None if variant else f"{question} (v{variant})"

    reqs = build_requests(samples, ["paraphrase"], 3, seed=0, paraphraser=custom)
    assert calls == [0, 1]
    assert reqs[1].question == f"{reqs[0].question} (v0)"
    assert reqs[2].question == default_paraphrase(reqs[0].question, 1)

    def parser_fails(question: str, variant: int) -> str:
        raise KeyError(question)

    reqs = build_requests(samples, ["paraphrase"], 2, seed=0, paraphraser=parser_fails)
    assert reqs[1].question == default_paraphrase(reqs[0].question, 0)

    def buggy(question: str, variant: int) -> str:
        raise RuntimeError("bug")

    with pytest.raises(RuntimeError):
        build_requests(samples, ["paraphrase"], 2, seed=0, paraphraser=buggy)


def test_near_dup_frames(samples):
    reqs = build_requests(samples, ["near_dup"], 2 * FRAMES_PER_SEQUENCE, seed=0)
    first = reqs[:FRAMES_PER_SEQUENCE]
    assert not first[0].image.transformed and not first[0].expect_reuse
    assert all(r.expect_reuse and r.question == first[0].question for r in first[1:])
    assert [r.image.shift[0] for r in first] == [2 * k for k in range(FRAMES_PER_SEQUENCE)]
    assert all(r.image.noise_sigma == 3.0 for r in first[1:])
    assert len({r.image.id for r in first}) == FRAMES_PER_SEQUENCE
    assert len({r.image.noise_seed for r in first[1:]}) == FRAMES_PER_SEQUENCE - 1
    original, shifted = first[0].image.load(), first[3].image.load()
    assert shifted.size == original.size
    diff = np.abs(np.asarray(shifted, np.int16) - np.asarray(original, np.int16))
    assert diff.mean() > 3
    assert np.array_equal(np.asarray(first[3].image.load()), np.asarray(shifted))  # reproducible


def test_tenants_ordering_and_reuse(samples):
    reqs = build_requests(samples, ["tenants"], 12, seed=0, tenants=3)
    assert [r.tenant for r in reqs[:6]] == ["tenant-0", "tenant-1", "tenant-2"] * 2
    assert [r.expect_reuse for r in reqs[:6]] == [False] * 3 + [True] * 3
    assert len({(r.image.id, r.question) for r in reqs[:6]}) == 1
    assert (reqs[6].image.id, reqs[6].question) != (reqs[0].image.id, reqs[0].question)
    seen = set()
    for r in reqs:
        assert r.expect_reuse == (_key(r) in seen)
        seen.add(_key(r))


def test_other_workloads_have_no_tenant(samples):
    reqs = build_requests(samples, ["zipf", "paraphrase", "near_dup"], 30, seed=0)
    assert all(r.tenant is None for r in reqs)


def test_restart_reasks_earlier_requests(samples):
    reqs = build_requests(samples, DEFAULT_WORKLOADS, 50, seed=2)
    flagged = [r.index for r in reqs if r.restart_before]
    restart = [r for r in reqs if r.workload == "restart"]
    assert flagged == [restart[0].index] and restart[0].index == 40
    earlier = {_key(r) for r in reqs[:40]}
    assert all(_key(r) in earlier and r.expect_reuse for r in restart)
    assert restart[0].index == len(reqs) - len(restart)  # restart block is last
    assert len({_key(r) for r in restart}) == len(restart)  # distinct while history lasts


def test_restart_keeps_tenant_of_reasked_request(samples):
    reqs = build_requests(samples, ["tenants", "restart"], 40, seed=0)
    restart = [r for r in reqs if r.workload == "restart"]
    assert {r.tenant for r in restart} == {"tenant-0", "tenant-1"}


def test_restart_alone_warms_up_first(samples):
    reqs = build_requests(samples, ["restart"], 8, seed=0)
    assert [r.restart_before for r in reqs] == [False] * 4 + [True] + [False] * 3
    assert [r.expect_reuse for r in reqs] == [False] * 4 + [True] * 4
    assert {_key(r) for r in reqs[4:]} <= {_key(r) for r in reqs[:4]}
