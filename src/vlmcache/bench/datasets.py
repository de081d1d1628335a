"""VQA datasets for ``vlmcache bench``: easy-vqa (built in), GQA and a plain JSONL format.

Every loader returns ``list[Sample]`` in a deterministic order and checks that each image
file exists, without reading pixels (the harness loads them later through ``ImageRef``).
Bad input raises :class:`DatasetError`, whose message names the file, the line or question
id and the problem.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from vlmcache.bench.types import Sample
from vlmcache.errors import VlmCacheError, require

GQA_IMAGE_SUFFIXES = (".jpg", ".png", ".jpeg")
EASY_VQA_SPLITS = ("train", "test")


class DatasetError(VlmCacheError, ValueError):
    """A dataset file is missing or malformed; the message says where and what is wrong."""


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise DatasetError(f"limit must be a positive integer or None, got {limit!r}")


def _nonempty(samples: list[Sample], source: str) -> list[Sample]:
    if not samples:
        raise DatasetError(f"{source}: no samples (empty dataset)")
    return samples


def _answer_text(value: Any, where: str) -> str | None:
    """An answer as text: strings as they are, numbers stringified, null as None."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    raise DatasetError(f"{where}: 'answer' must be a string, a number or null, got {value!r}")


def _text_field(obj: dict[str, Any], key: str, where: str) -> str:
    """A required, non-empty string field of a JSON object."""
    if key not in obj:
        raise DatasetError(f"{where}: missing key {key!r}")
    value = obj[key]
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not value.strip():
        raise DatasetError(f"{where}: {key!r} must be a non-empty string, got {value!r}")
    return value


# --------------------------------------------------------------------------- easy-vqa


def load_easy_vqa(split: str = "test", limit: int | None = None) -> list[Sample]:
    """easy-vqa's questions (in the package's order), the first ``limit`` of them.

    ``image_id`` is ``easyvqa-<split>-<id>``. Needs the ``easy_vqa`` package
    (``pip install 'vlmcache[bench]'``).
    """
    _check_limit(limit)
    if split not in EASY_VQA_SPLITS:
        raise DatasetError(f"easy-vqa split must be one of {EASY_VQA_SPLITS}, got {split!r}")
    easy_vqa: Any = require("easy_vqa", "bench")
    questions, answers, image_ids = getattr(easy_vqa, f"get_{split}_questions")()
    paths: dict[int, str] = getattr(easy_vqa, f"get_{split}_image_paths")()
    samples: list[Sample] = []
    for i, (question, answer, image_id) in enumerate(zip(questions, answers, image_ids)):
        if limit is not None and len(samples) >= limit:
            break
        path = paths.get(image_id)
        if path is None or not Path(path).is_file():
            raise DatasetError(f"easy-vqa {split} question {i}: image {image_id} not found")
        samples.append(Sample(Path(path), question, answer, f"easyvqa-{split}-{image_id}"))
    return _nonempty(samples, f"easy-vqa {split}")


# --------------------------------------------------------------------------- GQA


def _read_json(path: Path) -> Any:
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    try:
        with path.open(encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{path}: bad JSON at line {exc.lineno}: {exc.msg}") from exc


def _qid_key(qid: str) -> tuple[int, int, str]:
    """Numeric ids in numeric order, then the rest as strings."""
    return (0, int(qid), qid) if qid.isdigit() else (1, 0, qid)


def _gqa_entries(data: Any, path: Path) -> list[tuple[str, Any]]:
    """(question id, entry) pairs of a GQA dict or list, sorted by question id."""
    if isinstance(data, dict):
        entries = [(str(qid), entry) for qid, entry in data.items()]
    elif isinstance(data, list):
        entries = []
        for i, entry in enumerate(data):
            if not isinstance(entry, dict):
                raise DatasetError(f"{path}: item {i}: expected a JSON object, got {entry!r:.60}")
            entries.append((_text_field(entry, "questionId", f"{path}: item {i}"), entry))
    else:
        raise DatasetError(f"{path}: expected a JSON object (question id -> question) or a list")
    return sorted(entries, key=lambda e: _qid_key(e[0]))


def _gqa_image(image_dir: Path, image_id: str, where: str) -> Path:
    candidates = [image_dir / f"{image_id}{suffix}" for suffix in GQA_IMAGE_SUFFIXES]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    tried = ", ".join(c.name for c in candidates)
    raise DatasetError(f"{where}: image file not found in {image_dir} (tried {tried})")


def load_gqa(questions_json: Path, image_dir: Path, limit: int | None = None) -> list[Sample]:
    """GQA questions sorted by question id, the first ``limit`` of them.

    ``questions_json``: GQA's object mapping question id -> {"imageId", "question",
    "answer", ...}, or a list of such objects with "questionId". The image is
    ``image_dir/<imageId>.jpg`` (or .png / .jpeg). "answer" is optional (test splits).
    Only the kept questions are validated.
    """
    _check_limit(limit)
    questions_json, image_dir = Path(questions_json), Path(image_dir)
    if not image_dir.is_dir():
        raise DatasetError(f"{image_dir}: image directory not found")
    entries = _gqa_entries(_read_json(questions_json), questions_json)
    samples: list[Sample] = []
    for qid, entry in entries[:limit]:
        where = f"{questions_json}: question {qid}"
        if not isinstance(entry, dict):
            raise DatasetError(f"{where}: expected a JSON object, got {entry!r:.60}")
        image_id = _text_field(entry, "imageId", where)
        question = _text_field(entry, "question", where)
        answer = _answer_text(entry.get("answer"), where)
        image = _gqa_image(image_dir, image_id, where)
        samples.append(Sample(image, question, answer, f"gqa-{image_id}"))
    return _nonempty(samples, str(questions_json))


# --------------------------------------------------------------------------- JSONL


def _jsonl_sample(line: str, base: Path, where: str) -> Sample:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as exc:
        raise DatasetError(f"{where}: bad JSON: {exc.msg} (column {exc.colno})") from exc
    if not isinstance(obj, dict):
        raise DatasetError(f"{where}: expected a JSON object, got {obj!r:.60}")
    image = Path(_text_field(obj, "image", where)).expanduser()
    question = _text_field(obj, "question", where)
    answer = _answer_text(obj.get("answer"), where)
    path = image if image.is_absolute() else base / image
    if not path.is_file():
        raise DatasetError(f"{where}: image file not found: {path}")
    image_id = _text_field(obj, "image_id", where) if "image_id" in obj else path.stem
    return Sample(path, question, answer, image_id)


def load_jsonl(path: Path, limit: int | None = None, image_dir: Path | None = None) -> list[Sample]:
    """One JSON object per line: ``image`` (a path), ``question``, optional ``answer`` and
    ``image_id`` (default: the image file's stem). Blank lines are skipped.

    Relative image paths are resolved against ``image_dir`` if given, else against the
    JSONL file's directory.
    """
    _check_limit(limit)
    path = Path(path)
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    base = Path(image_dir) if image_dir is not None else path.parent
    samples: list[Sample] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if limit is not None and len(samples) >= limit:
                break
            if line.strip():
                samples.append(_jsonl_sample(line, base, f"{path}:{lineno}"))
    return _nonempty(samples, str(path))


# --------------------------------------------------------------------------- dispatch


def load_dataset(spec: str, limit: int | None = None, image_dir: Path | None = None) -> list[Sample]:
    """Load a dataset by ``spec``.

    ``"easy-vqa"`` (its test split; ``"easy-vqa:train"`` for train), a ``.jsonl`` file
    (``image_dir``, if given, is the base of relative image paths) or a GQA ``.json``
    questions file (needs ``image_dir``).
    """
    if spec in ("easy-vqa", "easy_vqa") or spec.startswith(("easy-vqa:", "easy_vqa:")):
        split = spec.partition(":")[2] or "test"
        return load_easy_vqa(split, limit)
    suffix = Path(spec).suffix.lower()
    if suffix == ".jsonl":
        return load_jsonl(Path(spec), limit, image_dir)
    if suffix == ".json":
        if image_dir is None:
            raise DatasetError(f"{spec}: a GQA questions file needs an image directory (image_dir)")
        return load_gqa(Path(spec), Path(image_dir), limit)
    raise DatasetError(
        f"unknown dataset {spec!r}: expected 'easy-vqa', a .jsonl file or a GQA .json file"
    )
