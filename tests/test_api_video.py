"""Videos through CachedLLM without an engine: validation, decoding with the engine's
sampling, the prompt vLLM's offline API gets, and near-duplicate canonicalization."""

import json

import numpy as np
import pytest

from vlmcache.api import CachedLLM, VlmRequest, model_video_placeholder
from vlmcache.api_media import VideoDecoder
from vlmcache.cascade import Resolution
from vlmcache.config import VlmCacheConfig
from vlmcache.errors import RequestError, RequestTooLarge
from vlmcache.keys import image_uuid
from vlmcache.serving.videos import video_data_url
from vlmcache.tenant_secret import deployment_salt
from vlmcache.testing.clips import synthetic_frames, write_clip

PROMPT = "USER: <video>\nWhat moves? ASSISTANT:"
#: the engine samples 4 of a clip's 8 frames (vLLM's --media-io-kwargs, as engine args)
ENGINE_ARGS = {"media_io_kwargs": {"video": {"num_frames": 4}}}


class RecordingEngine:
    """Records the prompts and parameters it is given; answers with empty outputs."""

    def __init__(self) -> None:
        self.prompts: list = []
        self.params: list = []

    def generate(self, prompts, params, use_tqdm=False):
        from types import SimpleNamespace

        self.prompts, self.params = list(prompts), list(params)
        return [SimpleNamespace(request_id=str(i), prompt_token_ids=[1, 2], outputs=[],
                                kv_transfer_params=None, num_cached_tokens=0, metrics=None)
                for i in range(len(prompts))]


@pytest.fixture(scope="module")
def frames() -> np.ndarray:
    return synthetic_frames(5, n=8, h=64, w=64)


@pytest.fixture(scope="module")
def clips(frames) -> dict[str, bytes]:
    changed = frames.copy()
    changed[-1, 10:40, 10:40] = (250, 250, 20)  # an object in a frame the sampling takes
    return {"ffv1": write_clip(None, frames, 4.0, "ffv1"),
            "huffyuv": write_clip(None, frames, 4.0, "huffyuv"),
            "mp4v": write_clip(None, frames, 4.0, "mp4v"),
            "changed": write_clip(None, changed, 4.0, "mp4v")}


def _llm(tmp_path, engine, **config) -> CachedLLM:
    cfg = VlmCacheConfig(store_path=str(tmp_path / "s"), model_revision="r1",
                         tenant_salt="unit-salt", **config)
    return CachedLLM(str(tmp_path), cfg, engine=engine, engine_args=ENGINE_ARGS)


@pytest.mark.parametrize("videos, prompt, message", [
    (("x",), PROMPT, "video 0 is a str"),
    ((b"",), PROMPT, "video 0 is empty"),
    ((), PROMPT, "1 video placeholder"),
    ((b"a", b"b"), PROMPT, "but 2 video"),
    ((b"a", b"b", b"c"), PROMPT * 3, "more than the 2 allowed per request"),
    (b"abc", PROMPT, "videos must be a tuple"),
])
def test_bad_videos_raise_request_error_naming_request_and_problem(tmp_path, videos, prompt,
                                                                   message):
    llm = _llm(tmp_path, RecordingEngine())
    with pytest.raises(RequestError, match=message) as err:
        llm.generate(["USER: hi ASSISTANT:", VlmRequest(prompt, videos=videos)])
    assert str(err.value).startswith("request 1:")


def test_undecodable_and_oversized_clips_are_refused_with_the_fronts_errors(tmp_path, clips):
    llm = _llm(tmp_path, RecordingEngine())
    with pytest.raises(RequestError, match="request 0: video 0: cannot decode the video"):
        llm.generate([VlmRequest(PROMPT, videos=(b"not a video at all",))])
    small = _llm(tmp_path, RecordingEngine(), max_video_bytes=1000)
    with pytest.raises(RequestTooLarge, match="request 0: video 0: .*max_video_bytes"):
        small.generate([VlmRequest(PROMPT, videos=(clips["ffv1"],))])
    few = _llm(tmp_path, RecordingEngine(), max_video_frames=3)
    with pytest.raises(RequestTooLarge, match="takes 4 frames.*max_video_frames"):
        few.generate([VlmRequest(PROMPT, videos=(clips["ffv1"],))])


def test_the_video_placeholder_comes_from_the_model_files(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"video_token_index": 9}))
    # transformers 5 keeps added tokens in tokenizer.json only
    (tmp_path / "tokenizer.json").write_text(json.dumps(
        {"added_tokens": [{"id": 8, "content": "<x>"}, {"id": 9, "content": "<|video_pad|>"}]}))
    assert model_video_placeholder(str(tmp_path)) == "<|video_pad|>"
    assert model_video_placeholder(str(tmp_path / "missing")) == "<video>"


def test_a_video_reaches_vllm_as_sampled_frames_under_a_tenant_scoped_identity(tmp_path,
                                                                               clips, frames):
    engine = RecordingEngine()
    llm = _llm(tmp_path, engine, enable_exact=False)
    outs = llm.generate([VlmRequest(PROMPT, tenant="acme", videos=(clips["ffv1"],)),
                         VlmRequest(PROMPT, tenant="acme", videos=(clips["huffyuv"],)),
                         VlmRequest(PROMPT, tenant="globex", videos=(clips["ffv1"],))])
    sent = [p["multi_modal_data"]["video"] for p in engine.prompts]
    (got, meta), = sent[0]
    assert got.shape == (4, 64, 64, 3) and len(meta["frames_indices"]) == 4
    assert np.array_equal(got, frames[meta["frames_indices"]])  # lossless: the same pixels
    uuids = [p["multi_modal_uuids"]["video"][0] for p in engine.prompts]
    video = outs[0].report.videos[0]
    assert uuids[0] == uuids[1] == image_uuid(deployment_salt(llm.config), "acme", video)
    assert outs[1].report.videos == outs[0].report.videos  # a re-mux is the same video
    assert uuids[2] != uuids[0] and engine.prompts[2]["cache_salt"] != engine.prompts[0][
        "cache_salt"]
    assert outs[0].report.video_frames == (4,)
    assert all(p.extra_args["kv_transfer_params"]["vlmcache"]["scoped_media"]
               for p in engine.params)


def test_a_lossy_re_encode_is_sent_as_the_canonical_clip(tmp_path, clips):
    engine = RecordingEngine()
    llm = _llm(tmp_path, engine, enable_video_near_duplicates=True)
    first = llm.generate([VlmRequest(PROMPT, tenant="acme", videos=(clips["ffv1"],))])[0]
    canonical_frames, _ = engine.prompts[0]["multi_modal_data"]["video"][0]
    lossy = llm.generate([VlmRequest(PROMPT, tenant="acme", videos=(clips["mp4v"],))])[0]
    assert lossy.report.statuses["video:near_duplicate"] == "hit"
    assert lossy.report.videos == first.report.videos
    sent, _ = engine.prompts[0]["multi_modal_data"]["video"][0]
    assert np.array_equal(sent, canonical_frames)  # the canonical clip's own frames
    changed = llm.generate([VlmRequest(PROMPT, tenant="acme", videos=(clips["changed"],))])[0]
    assert changed.report.statuses["video:near_duplicate"] == "miss"
    assert changed.report.videos != first.report.videos
    other = llm.generate([VlmRequest(PROMPT, tenant="globex", videos=(clips["mp4v"],))])[0]
    assert other.report.statuses["video:near_duplicate"] == "miss"


def test_a_canonical_clip_that_no_longer_decodes_to_its_identity_is_not_sent(tmp_path,
                                                                              clips):
    decoder = VideoDecoder(str(tmp_path), VlmCacheConfig(store_path=str(tmp_path)),
                           ENGINE_ARGS["media_io_kwargs"])
    own = decoder.decode(clips["mp4v"], "video 0", keep_url=False)
    ffv1 = decoder.decode(clips["ffv1"], "canonical", keep_url=False)

    def resolution(url: str, canonical_hash: str) -> Resolution:
        return Resolution(PROMPT, None, None, video_hashes=(canonical_hash,),
                          video_urls=(url,))

    good = decoder.canonical([own], resolution(video_data_url(clips["ffv1"]),
                                               ffv1.content_hash))
    assert good is not None and good[0].content_hash == ffv1.content_hash
    assert decoder.canonical([own], resolution(video_data_url(clips["huffyuv"]),
                                               "another-identity")) is None
    assert decoder.canonical([own], resolution("data:video/mp4;base64,AAAA",
                                               ffv1.content_hash)) is None
    assert decoder.canonical([own], Resolution(PROMPT, None, None,
                                               video_hashes=(own.content_hash,))) == (own,)
