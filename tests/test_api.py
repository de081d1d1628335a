"""CachedLLM's bad-input errors (no engine: a stand-in that records what it is given)."""

import json

import pytest
from PIL import Image

from vlmcache.api import CachedLLM, VlmRequest, model_image_placeholder
from vlmcache.config import VlmCacheConfig
from vlmcache.errors import ConfigError, RequestError


class NoEngine:
    def generate(self, *args, **kwargs):  # pragma: no cover - must never be reached
        raise AssertionError("a bad request reached the engine")


@pytest.fixture
def llm(tmp_path):
    return CachedLLM(str(tmp_path), VlmCacheConfig(store_path=str(tmp_path / "s")),
                     enabled=False, engine=NoEngine())


IMG = Image.new("RGB", (8, 8))


@pytest.mark.parametrize("request_, message", [
    (VlmRequest("USER: <image>\nWhat? ASSISTANT:"), "1 image placeholder"),
    (VlmRequest("USER: What? ASSISTANT:", (IMG,)), "0 image placeholder"),
    (VlmRequest("USER: <image>\nWhat? ASSISTANT:", (IMG, IMG)), "but 2 image"),
    (VlmRequest("USER: <image> ASSISTANT:", ("not an image",)), "image 0 is a str"),
    (VlmRequest("USER: <image> ASSISTANT:", (IMG,), question="absent"), "question"),
])
def test_bad_requests_raise_request_error_naming_the_problem(llm, request_, message):
    with pytest.raises(RequestError, match=message) as err:
        llm.generate([request_])
    assert "request 0" in str(err.value)


def test_a_bare_string_is_not_a_list_of_requests(llm):
    with pytest.raises(RequestError, match="requests: expected a list"):
        llm.generate("abc")
    with pytest.raises(RequestError, match="requests: expected a list"):
        llm.generate(VlmRequest("hi"))


def test_a_misspelled_config_keyword_is_a_config_error_naming_it(tmp_path):
    with pytest.raises(ConfigError, match="'stor_path' \\(did you mean 'store_path'\\?\\)"):
        VlmCacheConfig(stor_path="/x")
    with pytest.raises(ConfigError, match="stor_path"):
        CachedLLM(str(tmp_path), {"stor_path": "/x"}, enabled=False, engine=NoEngine())


def test_placeholder_comes_from_the_model_files(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"image_token_index": 7}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"added_tokens_decoder": {"7": {"content": "<|image_pad|>"}}}))
    assert model_image_placeholder(str(tmp_path)) == "<|image_pad|>"
    assert model_image_placeholder(str(tmp_path / "missing")) == "<image>"


class RecordingEngine:
    """Records the sampling parameters of each prompt and answers with empty outputs."""

    def __init__(self) -> None:
        self.params: list = []

    def generate(self, prompts, params, use_tqdm=False):
        from types import SimpleNamespace

        self.params = list(params)
        return [SimpleNamespace(request_id=str(i), prompt_token_ids=[1, 2], outputs=[],
                                kv_transfer_params=None, num_cached_tokens=0, metrics=None)
                for i in range(len(prompts))]


def test_each_request_carries_its_own_tenant_to_the_kv_tier(tmp_path):
    engine = RecordingEngine()
    config = VlmCacheConfig(store_path=str(tmp_path / "s"), model_revision="r1")
    llm = CachedLLM(str(tmp_path), config, engine=engine)
    llm.generate([VlmRequest("USER: <image>\nWhat? ASSISTANT:", (IMG,), tenant="acme"),
                  VlmRequest("USER: <image>\nWhat? ASSISTANT:", (IMG,))])
    ours = [p.extra_args["kv_transfer_params"]["vlmcache"] for p in engine.params]
    # CachedLLM minted both images' identities: the encoder tier may store derived ones
    assert ours == [{"bypass": False, "tenant": "acme", "scoped_media": True},
                    {"bypass": False, "scoped_media": True}]


def test_the_engine_is_started_from_the_roomy_frame(tmp_path, monkeypatch):
    """vllm.LLM is created inside stack_room's trampoline (its forked EngineCore runs
    on that stack chunk); the engine arguments reach it unchanged."""
    import sys

    import vllm

    seen = {}

    class FakeLLM:
        def __init__(self, **kwargs):
            frame, names = sys._getframe(), []
            while frame is not None:
                names.append(frame.f_code.co_name)
                frame = frame.f_back
            seen.update(kwargs=kwargs, frames=names)

    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    CachedLLM(str(tmp_path), VlmCacheConfig(store_path=str(tmp_path / "s")), enabled=False,
              engine_args={"max_model_len": 512})
    assert seen["kwargs"] == {"model": str(tmp_path), "max_model_len": 512}
    assert "_trampoline" in seen["frames"]
