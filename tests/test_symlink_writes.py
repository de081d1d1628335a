"""Files vlmcache writes beside the store never follow a planted symlink (issue 33, item 9).

The weights-digest memo and the vector index wrote a predictable temp name
(``.<name>.<pid>[.<thread>].tmp``) with a plain ``open(..., "w")``: a symlink planted there
by another local user sent our bytes into any file we may write. Every such write now goes
through :func:`vlmcache.store.chunkfile.write_private_file` (unique 0600 temp file,
``O_CREAT|O_EXCL|O_NOFOLLOW``, then ``os.replace``).
"""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path

import numpy as np
import pytest

import vlmcache.store.chunkfile as chunkfile
from vlmcache.index import IndexEntry, VectorIndex
from vlmcache.keys import weights_revision

SECRET = b"another user's file: keep me"


@pytest.fixture
def secret(tmp_path: Path) -> Path:
    path = tmp_path / "victim"
    path.write_bytes(SECRET)
    return path


@pytest.fixture
def fixed_tmp_names(monkeypatch):
    """Make the unique temp names predictable, so a test can plant a link at one."""
    monkeypatch.setattr(chunkfile.secrets, "token_hex", lambda n: "feed" * (n // 2))
    return "feedfeed"


def model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"weights")
    return model


def is_private_file(path: Path) -> bool:
    st = os.lstat(path)
    return stat.S_ISREG(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o600


def test_weights_memo_ignores_a_link_at_its_old_temp_name_and_its_final_name(tmp_path,
                                                                          secret):
    store = tmp_path / "store"
    store.mkdir()
    memo = store / "weights-digests.json"
    (store / f".{memo.name}.{os.getpid()}.tmp").symlink_to(secret)  # the old temp name
    memo.symlink_to(secret)
    model = model_dir(tmp_path)
    digest = weights_revision(model, memo)
    assert secret.read_bytes() == SECRET
    assert is_private_file(memo) and len(json.loads(memo.read_text())) == 1
    assert weights_revision(model, memo) == digest  # read back from the memo


def test_weights_memo_write_fails_cleanly_on_a_link_at_its_temp_path(tmp_path, secret,
                                                                     fixed_tmp_names):
    store = tmp_path / "store"
    store.mkdir()
    (store / f".memo.{os.getpid()}.{fixed_tmp_names}.tmp").symlink_to(secret)
    memo = store / "weights-digests.json"
    digest = weights_revision(model_dir(tmp_path), memo)  # the memo is only an optimisation
    assert len(digest) == 64 and not memo.exists() and secret.read_bytes() == SECRET


def test_a_missing_store_root_is_created_private(tmp_path):
    memo = tmp_path / "new" / "store" / "weights-digests.json"
    weights_revision(model_dir(tmp_path), memo)
    assert stat.S_IMODE(os.stat(tmp_path / "new" / "store").st_mode) == 0o700


def filled_index(path: Path) -> VectorIndex:
    index = VectorIndex(8, path)
    vecs = np.eye(8, dtype=np.float32)
    for i in range(4):
        index.add(IndexEntry(f"k{i}", "t"), vecs[i])
    return index


def test_vector_index_ignores_links_at_its_old_temp_names_and_final_names(tmp_path, secret):
    path = tmp_path / "ix" / "text"
    path.parent.mkdir()
    index = filled_index(path)
    ident = f"{os.getpid()}.{threading.get_ident()}"
    (path.parent / f".text.json.{ident}.tmp").symlink_to(secret)  # the old temp names
    (path.parent / "text.json").symlink_to(secret)
    assert index.save()
    assert secret.read_bytes() == SECRET and is_private_file(path.parent / "text.json")
    assert all(is_private_file(p) for p in path.parent.glob("*.faiss"))
    assert len(VectorIndex(8, path)) == 4


def test_vector_index_save_fails_cleanly_on_a_link_at_its_temp_path(tmp_path, secret,
                                                                    fixed_tmp_names):
    path = tmp_path / "ix" / "text"
    path.parent.mkdir()
    index = filled_index(path)
    for stem in ("index", "meta"):
        (path.parent / f".{stem}.{os.getpid()}.{fixed_tmp_names}.tmp").symlink_to(secret)
    assert not index.save()  # logged; nothing raised, the index stays in memory
    assert index.dirty and len(index) == 4 and secret.read_bytes() == SECRET


def test_logging_config_replaces_a_link_at_its_path(tmp_path, secret):
    pytest.importorskip("vllm")
    from vlmcache.vllm.logs import write_logging_config

    path = tmp_path / "run" / "logging.json"
    path.parent.mkdir()
    path.symlink_to(secret)
    assert write_logging_config(path) == path
    assert secret.read_bytes() == SECRET and is_private_file(path)
    assert "vlmcache" in json.loads(path.read_text())["loggers"]


def test_write_private_file_refuses_a_directory_at_its_path(tmp_path):
    (tmp_path / "target").mkdir()
    with pytest.raises(OSError):
        chunkfile.write_private_file(tmp_path / "target", b"x", stem="t")
    assert [p.name for p in tmp_path.iterdir()] == ["target"]  # no temp file left behind


def test_memo_and_index_are_not_read_through_planted_links(tmp_path):
    """A forged memo behind a link would hide changed weights; a linked index is not ours."""
    store = tmp_path / "store"
    store.mkdir()
    model = model_dir(tmp_path)
    honest = weights_revision(model, store / "weights-digests.json")
    key = next(iter(json.loads((store / "weights-digests.json").read_text())))
    forged = tmp_path / "forged.json"
    forged.write_text(json.dumps({key: "00" * 32}))
    (store / "weights-digests.json").unlink()
    (store / "weights-digests.json").symlink_to(forged)
    assert weights_revision(model, store / "weights-digests.json") == honest
    index_dir = tmp_path / "ix"
    index_dir.mkdir()
    filled_index(tmp_path / "elsewhere" / "text").save()
    for item in (tmp_path / "elsewhere").iterdir():
        (index_dir / item.name).symlink_to(item)
    assert len(VectorIndex(8, index_dir / "text")) == 0
