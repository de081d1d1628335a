"""Dataset loaders: easy-vqa, GQA and JSONL, with their error messages."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from PIL import Image

from vlmcache.bench.datasets import (
    DatasetError,
    load_dataset,
    load_easy_vqa,
    load_gqa,
    load_jsonl,
)
from vlmcache.bench.types import Sample
from vlmcache.errors import VlmCacheError


def _png(path: Path, color: tuple[int, int, int] = (200, 10, 10)) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (8, 8), color).save(path)
    return path


def _write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------------- easy-vqa


def test_easy_vqa_limit_and_ids():
    easy_vqa = pytest.importorskip("easy_vqa")
    samples = load_easy_vqa("test", limit=5)
    questions, answers, ids = easy_vqa.get_test_questions()
    assert len(samples) == 5
    assert [s.question for s in samples] == questions[:5]
    assert [s.answer for s in samples] == answers[:5]
    assert samples[0].image_id == f"easyvqa-test-{ids[0]}"
    assert all(s.image_path.is_file() and s.image_path.suffix == ".png" for s in samples)


def test_easy_vqa_train_split_and_bad_split():
    pytest.importorskip("easy_vqa")
    assert load_easy_vqa("train", limit=2)[0].image_id.startswith("easyvqa-train-")
    with pytest.raises(DatasetError, match="split"):
        load_easy_vqa("validation")


def test_easy_vqa_missing_package_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "easy_vqa", None)  # makes ``import easy_vqa`` fail
    with pytest.raises(VlmCacheError, match=r"pip install 'vlmcache\[bench\]'"):
        load_easy_vqa(limit=1)


# --------------------------------------------------------------------------- GQA


@pytest.fixture
def gqa(tmp_path: Path) -> tuple[Path, Path]:
    images = tmp_path / "images"
    _png(images / "n100.jpg")
    _png(images / "n200.png", (0, 200, 0))
    questions = {
        "20": {"imageId": "n200", "question": "What color is it?", "answer": "green"},
        "3": {"imageId": "n100", "question": "Is it red?", "answer": "yes", "types": {}},
        "100": {"imageId": "n100", "question": "What is it?"},
    }
    path = tmp_path / "questions.json"
    path.write_text(json.dumps(questions), encoding="utf-8")
    return path, images


def test_gqa_sorted_by_question_id_with_png_fallback(gqa):
    path, images = gqa
    samples = load_gqa(path, images)
    assert [s.question for s in samples] == ["Is it red?", "What color is it?", "What is it?"]
    assert samples[0].image_path == images / "n100.jpg"
    assert samples[1].image_path == images / "n200.png"
    assert samples[1].image_id == "gqa-n200"
    assert samples[2].answer is None
    assert len(load_gqa(path, images, limit=2)) == 2


def test_gqa_list_format(gqa):
    path, images = gqa
    entries = [{"questionId": qid, **entry} for qid, entry in json.loads(path.read_text()).items()]
    list_path = path.with_name("list.json")
    list_path.write_text(json.dumps(entries), encoding="utf-8")
    assert load_gqa(list_path, images) == load_gqa(path, images)


def test_gqa_errors_name_question_and_problem(tmp_path, gqa):
    path, images = gqa
    data = json.loads(path.read_text())
    data["7"] = {"imageId": "missing", "question": "Where?"}
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(data))
    with pytest.raises(DatasetError, match=r"question 7: image file not found.*missing\.jpg"):
        load_gqa(bad, images)
    data["7"] = {"imageId": "n100"}
    bad.write_text(json.dumps(data))
    with pytest.raises(DatasetError, match=r"bad\.json: question 7: missing key 'question'"):
        load_gqa(bad, images)
    bad.write_text('{"1": {"imageId": ')
    with pytest.raises(DatasetError, match=r"bad\.json: bad JSON"):
        load_gqa(bad, images)
    bad.write_text("{}")
    with pytest.raises(DatasetError, match="empty dataset"):
        load_gqa(bad, images)
    bad.write_text(json.dumps([{"imageId": "n100", "question": "q"}]))
    with pytest.raises(DatasetError, match=r"item 0: missing key 'questionId'"):
        load_gqa(bad, images)


# --------------------------------------------------------------------------- JSONL


def test_jsonl_relative_paths_blank_lines_and_optional_answer(tmp_path):
    _png(tmp_path / "imgs" / "a.png")
    absolute = _png(tmp_path / "elsewhere" / "b.png")
    path = _write_jsonl(tmp_path / "data.jsonl", [
        json.dumps({"image": "imgs/a.png", "question": "What is it?", "answer": "red"}),
        "",
        "   ",
        json.dumps({"image": str(absolute), "question": "How many?", "answer": 2}),
        json.dumps({"image": "imgs/a.png", "question": "Any?", "image_id": "custom"}),
    ])
    samples = load_jsonl(path)
    assert samples == [
        Sample(tmp_path / "imgs" / "a.png", "What is it?", "red", "a"),
        Sample(absolute, "How many?", "2", "b"),
        Sample(tmp_path / "imgs" / "a.png", "Any?", None, "custom"),
    ]
    assert len(load_jsonl(path, limit=2)) == 2


def test_jsonl_stops_at_limit_before_bad_lines(tmp_path):
    _png(tmp_path / "a.png")
    path = _write_jsonl(tmp_path / "d.jsonl", [json.dumps({"image": "a.png", "question": "q"}),
                                               "not json"])
    assert len(load_jsonl(path, limit=1)) == 1


@pytest.mark.parametrize("line, message", [
    ('{"image": "a.png"}', r"d\.jsonl:2: missing key 'question'"),
    ('{"question": "q"}', r"d\.jsonl:2: missing key 'image'"),
    ('{"image": "nope.png", "question": "q"}', r"d\.jsonl:2: image file not found: .*nope\.png"),
    ('{"image": "a.png", "question": "q"', r"d\.jsonl:2: bad JSON"),
    ('["a.png", "q"]', r"d\.jsonl:2: expected a JSON object"),
    ('{"image": "a.png", "question": ""}', r"d\.jsonl:2: 'question' must be a non-empty string"),
    ('{"image": "a.png", "question": "q", "answer": [1]}', r"d\.jsonl:2: 'answer' must be"),
])
def test_jsonl_errors_name_file_line_and_problem(tmp_path, line, message):
    _png(tmp_path / "a.png")
    path = _write_jsonl(tmp_path / "d.jsonl", [json.dumps({"image": "a.png", "question": "q"}),
                                               line])
    with pytest.raises(DatasetError, match=message):
        load_jsonl(path)


def test_jsonl_empty_and_missing_file(tmp_path):
    empty = _write_jsonl(tmp_path / "empty.jsonl", ["", ""])
    with pytest.raises(DatasetError, match=r"empty\.jsonl: no samples \(empty dataset\)"):
        load_jsonl(empty)
    with pytest.raises(DatasetError, match="no such file"):
        load_jsonl(tmp_path / "absent.jsonl")


def test_loaders_do_not_read_pixels(tmp_path):
    (tmp_path / "junk.png").write_bytes(b"not an image at all")
    path = _write_jsonl(tmp_path / "d.jsonl", [json.dumps({"image": "junk.png", "question": "q"})])
    assert load_jsonl(path)[0].image_path == tmp_path / "junk.png"


# --------------------------------------------------------------------------- dispatch


def test_load_dataset_dispatch(tmp_path, gqa):
    path, images = gqa
    assert load_dataset(str(path), image_dir=images) == load_gqa(path, images)
    with pytest.raises(DatasetError, match="image directory"):
        load_dataset(str(path))
    _png(tmp_path / "a.png")
    jsonl = _write_jsonl(tmp_path / "d.jsonl", [json.dumps({"image": "a.png", "question": "q"})])
    assert load_dataset(str(jsonl)) == load_jsonl(jsonl)
    with pytest.raises(DatasetError, match="unknown dataset"):
        load_dataset(str(tmp_path / "data.csv"))
    with pytest.raises(DatasetError, match="limit"):
        load_dataset(str(jsonl), limit=0)


def test_load_dataset_easy_vqa():
    pytest.importorskip("easy_vqa")
    assert load_dataset("easy-vqa", limit=3) == load_easy_vqa("test", limit=3)
    assert load_dataset("easy-vqa:train", limit=1)[0].image_id.startswith("easyvqa-train-")
