"""Held media behind `vlmcache proxy` when the real vLLM server behind it restarts.

The proxy's front believes vLLM's processor cache holds an image it sent; after the
engine's restart that cache is empty, vLLM refuses the identity with its 400, and the
front resends the full body: the client sees one answer, the one the full image gets.
"""

from __future__ import annotations

import sys
from pathlib import Path

import openai
import pytest
from prometheus_client import CollectorRegistry

sys.path.insert(0, str(Path(__file__).parent))
from fakes import serving  # noqa: E402

from vlmcache.config import VlmCacheConfig  # noqa: E402
from vlmcache.serving.front import CascadeFront  # noqa: E402
from vlmcache.serving.metrics import FrontMetrics  # noqa: E402
from vlmcache.serving.proxy import build_proxy_app  # noqa: E402
from vlmcache.testing.server import ServerProcess, data_url  # noqa: E402

pytestmark = pytest.mark.vllm


def _ask(client: openai.OpenAI, model: str, question: str, url: str, tenant: str):
    resp = client.chat.completions.create(
        model=model, temperature=0, max_tokens=4, extra_body={"cache_salt": tenant},
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}},
                                               {"type": "text", "text": question}]}])
    return resp.choices[0].message.content, resp.model_extra["vlmcache"]


def _image_url() -> str:
    from PIL import Image

    from vlmcache.bench.datasets import load_easy_vqa

    sample = next(iter(load_easy_vqa("test", limit=1)))
    return data_url(Image.open(sample.image_path))


def test_an_engine_restart_behind_the_proxy_costs_one_resend_and_no_answer(tiny_vqa_model,
                                                                          tmp_path):
    engine = ServerProcess(tiny_vqa_model, {"store_path": str(tmp_path / "engine-store"),
                                            "memory_budget": "256MiB"},
                           tmp_path / "engine.log", vllm_args=["--vlmcache-no-front"]).start()
    try:
        registry = CollectorRegistry()
        front = CascadeFront.for_model(str(tiny_vqa_model), VlmCacheConfig(
            store_path=str(tmp_path / "front-store"), max_image_bytes=200_000,
            enable_semantic_text=False, enable_image_embedding=False),
            metrics=FrontMetrics.create(registry))
        app = build_proxy_app(front, [engine.url], routing="round_robin", registry=registry)
        model, url = str(tiny_vqa_model), _image_url()
        with serving(app) as proxy:
            client = openai.OpenAI(base_url=proxy + "/v1", api_key="unused", max_retries=0)
            _, first = _ask(client, model, "what is the color of the shape?", url, "t1")
            _, named = _ask(client, model, "what shape is in the image?", url, "t1")
            assert "held_media" not in first and named["held_media"] == "elided", named
            engine.stop()  # a new engine on the same port: its processor cache is empty
            engine.start()
            after, resent = _ask(client, model, "is the shape large?", url, "t1")
            assert resent["held_media"] == "resent" and resent["hit_tier"] is None, resent
            full, other = _ask(client, model, "is the shape large?", url, "t2")
            assert "held_media" not in other and after == full
            _, again = _ask(client, model, "where is the shape?", url, "t1")
            assert again["held_media"] == "elided", again  # held again since the resend
        assert registry.get_sample_value("vlmcache_front_held_media_total",
                                         {"outcome": "resent"}) == 1
    finally:
        engine.stop()
