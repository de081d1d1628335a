"""FAISS vector index: search, tenant filter, removal, HNSW switch, crash-safe persistence."""

from __future__ import annotations

import numpy as np
import pytest

from vlmcache.index import IndexEntry, VectorIndex


def _vectors(n, dim=16, seed=0):
    v = np.random.default_rng(seed).normal(size=(n, dim)).astype(np.float32)
    return v / np.linalg.norm(v, axis=1, keepdims=True)


def _filled(path=None, n=40, hnsw_threshold=1000):
    index = VectorIndex(16, path, hnsw_threshold=hnsw_threshold)
    vecs = _vectors(n)
    for i, v in enumerate(vecs):
        index.add(IndexEntry(f"k{i}", "a" if i % 2 else "b", context=str(i % 3)), v)
    return index, vecs


def test_exact_search_finds_itself_and_filters():
    index, vecs = _filled()
    assert index.kind == "flat" and len(index) == 40
    hit = index.search(vecs[7])[0]
    assert hit.entry.key == "k7" and hit.score == pytest.approx(1.0, abs=1e-5)
    only_b = index.search(vecs[7], k=3, accept=lambda e: e.tenant == "b")
    assert [h.entry.tenant for h in only_b] == ["b"] * 3
    assert index.search(vecs[7], accept=lambda e: False) == []


def test_remove_and_replace():
    index, vecs = _filled()
    assert index.remove(["k7", "missing"]) == 1
    assert index.search(vecs[7])[0].entry.key != "k7"
    assert index.get("k7") is None and len(index) == 39
    index.add(IndexEntry("k8", "z"), vecs[0])  # replacing moves k8's vector
    assert index.search(vecs[0], k=2)[1].entry.key in ("k0", "k8")
    assert index.get("k8").tenant == "z"
    assert index.remove_where(lambda e: e.context == "0") > 0
    assert all(h.entry.context != "0" for h in index.search(vecs[3], k=30))


def test_switches_to_hnsw_past_threshold_and_back():
    index, vecs = _filled(n=60, hnsw_threshold=50)
    assert index.kind == "hnsw"
    assert index.search(vecs[33])[0].entry.key == "k33"
    index.remove([f"k{i}" for i in range(20)])
    assert index.kind == "flat" and len(index) == 40
    assert index.search(vecs[33])[0].entry.key == "k33"


def test_persist_restore(tmp_path):
    index, vecs = _filled(tmp_path / "ix" / "text")
    index.remove(["k3"])
    index.save()
    again = VectorIndex(16, tmp_path / "ix" / "text")
    assert len(again) == 39 and again.get("k3") is None
    assert again.search(vecs[5])[0].entry == index.get("k5")
    assert len(list((tmp_path / "ix").glob("*.faiss"))) == 1


def test_torn_or_foreign_files_start_empty(tmp_path):
    index, _ = _filled(tmp_path / "text")
    index.save()
    blob = next(tmp_path.glob("*.faiss"))
    blob.write_bytes(blob.read_bytes()[:100])
    assert len(VectorIndex(16, tmp_path / "text")) == 0
    (tmp_path / "text.json").write_text("{not json")
    assert len(VectorIndex(16, tmp_path / "text")) == 0
    assert len(VectorIndex(8, tmp_path / "other")) == 0


def test_scope_search_small_large_and_whole(tmp_path):
    index = VectorIndex(16, None, hnsw_threshold=30,
                        scope_of=lambda e: f"{e.tenant}/{e.context}")
    vecs = _vectors(200)
    index.add_many([IndexEntry(f"k{i}", "a" if i < 190 else "b", context=str(i % 2))
                    for i in range(200)], vecs)
    assert index.kind == "hnsw" and len(index) == 200
    small = index.search_scope(vecs[191], "b/1", k=3)
    assert [h.entry.key for h in small][0] == "k191"
    assert {h.entry.key for h in small} <= {f"k{i}" for i in range(191, 200, 2)}
    large = index.search_scope(vecs[4], "a/0", k=5)
    assert large[0].entry.key == "k4" and all(h.entry.context == "0" for h in large)
    assert index.search_scope(vecs[4], "nobody", k=2) == []
    index.remove(["k191"])
    assert "k191" not in {h.entry.key for h in index.search_scope(vecs[191], "b/1", k=9)}


def test_scope_search_with_one_scope_and_monkeypatched_small_limit(monkeypatch):
    import vlmcache.index.faiss_index as fi

    monkeypatch.setattr(fi, "SMALL_SCOPE", 4)
    index = VectorIndex(16, None, hnsw_threshold=None)
    vecs = _vectors(50)
    index.add_many([IndexEntry(f"k{i}", "t" if i % 5 else "u") for i in range(50)], vecs)
    assert index.kind == "flat"
    assert index.search_scope(vecs[10], "u", k=1)[0].entry.key == "k10"  # via ID selector
    assert index.search_scope(vecs[11], "t", k=1)[0].entry.key == "k11"


def test_one_omp_thread_restores_the_thread_setting_and_keeps_results():
    """Issue 35: searches run FAISS on the calling thread alone, with the same results,
    and leave the thread's OpenMP setting as it was."""
    import faiss

    from vlmcache.index.faiss_index import one_omp_thread

    index, vecs = _filled()
    before = faiss.omp_get_max_threads()
    with one_omp_thread(faiss):
        assert faiss.omp_get_max_threads() == 1
        inside = [(h.entry.key, h.score) for h in index.search_scope(vecs[3], "a", k=5)]
    assert faiss.omp_get_max_threads() == before
    hits = index.search_scope(vecs[3], "a", k=5)
    assert [(h.entry.key, h.score) for h in hits] == inside
    assert hits[0].entry.key == "k3"
