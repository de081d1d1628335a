"""The accuracy run's mapping of the GPU trace onto easy-vqa, and its figures (no server)."""

from __future__ import annotations

from vlmcache_lab.serve_gpu_accuracy import accuracy_figures, easy_vqa_groups, to_load_request
from vlmcache_lab.serve_gpu_trace import build_trace
from vlmcache_lab.serve_load import LoadRequest


def test_trace_kinds_keep_their_meaning_on_easy_vqa() -> None:
    trace = build_trace(300, seed=0)
    groups = easy_vqa_groups()
    mix = [to_load_request(r, groups) for r in trace]
    assert [m.kind for m in mix] == [r.kind for r in trace]
    assert all(m.truth for m in mix)
    first: dict[tuple[int, str], LoadRequest] = {}
    for r, m in zip(trace, mix):
        if r.kind in ("new", "followup"):
            first[(r.image.base, r.question)] = m
    for r, m in zip(trace, mix):
        src = first.get((r.image.base, r.question))
        if r.kind == "repeat":
            assert (m.question, m.image_url, m.truth) == (src.question, src.image_url, src.truth)
        elif r.kind in ("jpeg", "frame"):
            assert m.question == src.question and m.image_url != src.image_url
            assert m.truth == src.truth
        elif r.kind == "paraphrase":
            assert m.image_url.startswith("data:image/png")
    flood = [m.image_url for r, m in zip(trace, mix) if r.kind == "flood"]
    assert len(set(flood)) == len(flood)  # the flooding tenant's images are all new


def test_accuracy_with_and_without_cache_over_the_same_requests() -> None:
    mix = [LoadRequest("new", "a", "q1", "u1", "yes"), LoadRequest("repeat", "a", "q1", "u1", "yes"),
           LoadRequest("new", "a", "q2", "u2", "red")]
    rows = [{"i": 0, "status": 200, "answer": "Yes"}, {"i": 1, "status": 200, "answer": "no"},
            {"i": 2, "status": -1, "answer": None}]
    out = accuracy_figures(rows, mix, {("q1", "u1"): "yes", ("q2", "u2"): "red"})
    diff = out.pop("differing")
    assert out == {"n": 2, "accuracy": 0.5, "accuracy_no_cache": 1.0, "equal": False}
    assert [(d["i"], d["answer"], d["answer_no_cache"], d["truth"]) for d in diff] == \
        [(1, "no", "yes", "yes")]
