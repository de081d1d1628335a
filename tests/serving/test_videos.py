"""Videos through the front: decoded with vLLM's loader, named by their sampled frames,
bound in every tier, refused within limits (a CPU stand-in for vLLM's app, no engine)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from fakes import chat, clip_bytes, clip_frames, image, video_chat, video_url  # noqa: E402
from test_front_asgi import Rig  # noqa: E402

from vlmcache.config import VlmCacheConfig  # noqa: E402
from vlmcache.serving.openai_req import VIDEO_MARK, parse_request  # noqa: E402
from vlmcache.vllm.video_io import VideoSampling  # noqa: E402

EIGHT = VideoSampling({"video": {"num_frames": 8}})


def _hash(data: bytes, sampling: VideoSampling = EIGHT, **body_extra) -> str:
    req = parse_request("chat", video_chat("What happens?", data, **body_extra), {},
                        VlmCacheConfig(), sampling)
    assert req.transcript is not None and VIDEO_MARK in req.transcript
    return req.videos[0].content_hash


def test_the_same_frames_in_another_lossless_container_have_one_identity():
    frames = clip_frames()
    mkv, avi, png = (clip_bytes(frames, "ffv1-mp4"), clip_bytes(frames, "huffyuv"),
                     clip_bytes(frames, "png"))
    assert len({mkv, avi, png}) == 3
    assert _hash(mkv) == _hash(avi) == _hash(png)


@pytest.mark.parametrize("edit", ["one_frame", "reversed", "shifted", "trimmed", "lossy"])
def test_a_changed_clip_is_another_video(edit):
    frames = clip_frames()
    other = frames.copy()
    if edit == "one_frame":
        other[11, 50:60, 80:90] = 255  # the last frame (sampled) gains an object
    elif edit == "reversed":
        other = frames[::-1].copy()
    elif edit == "shifted":
        other = np.concatenate([frames[1:], frames[-1:]])
    elif edit == "trimmed":
        other = frames[:-2].copy()
    data = clip_bytes(other, "mp4v") if edit == "lossy" else clip_bytes(other)
    assert _hash(data) != _hash(clip_bytes(frames))


def test_sampling_decides_the_identity_as_the_engine_samples():
    data = clip_bytes(clip_frames())
    eight, all_frames = _hash(data), _hash(data, VideoSampling({"video": {"num_frames": -1}}))
    assert eight != all_frames
    # a request's own media_io_kwargs override the server's, as in vLLM
    assert _hash(data, media_io_kwargs={"video": {"num_frames": -1}}) == all_frames
    assert _hash(data, mm_processor_kwargs={"fps": 2}) != eight


def test_repeats_hit_the_response_and_exact_tiers_and_tenants_never_share(tmp_path):
    rig = Rig(tmp_path, response_after_canonical=False)  # the exact tier reaches the engine
    mkv, avi = clip_bytes(clip_frames(), "ffv1"), clip_bytes(clip_frames(), "huffyuv")
    first = rig.post(video_chat("What moves?", mkv, tenant="A"))
    assert first.status_code == 200, first.text
    report = first.json()["vlmcache"]
    assert report["video_frames"] == [12] and len(report["videos"]) == 1
    again = rig.post(video_chat("What moves?", avi, tenant="A"))  # other bytes, same frames
    assert again.json()["vlmcache"]["hit_tier"] == "response"
    spaced = rig.post(video_chat("  what   moves? ", avi, tenant="A"))
    assert spaced.json()["vlmcache"]["hit_tier"] == "text:exact"
    sent = [b["messages"][0]["content"][0] for b in rig.engine.bodies]
    assert sent[0]["uuid"] == sent[1]["uuid"] and sent[0]["uuid"].startswith("vlmc-")
    assert sent[0]["video_url"]["url"] == video_url(mkv)  # vLLM decodes what was sent
    # the engine answered the first: it holds the clip, named now by its identity alone
    assert sent[1]["video_url"] is None and spaced.json()["vlmcache"]["held_media"] == "elided"
    other_tenant = rig.post(video_chat("What moves?", mkv, tenant="B"))
    assert _misses(other_tenant)
    assert rig.engine.bodies[-1]["messages"][0]["content"][0]["uuid"] != sent[0]["uuid"]
    changed = clip_frames()
    changed[-1, 0:8, 0:8] = 255
    miss = rig.post(video_chat("  what   moves? ", clip_bytes(changed), tenant="A"))
    assert _misses(miss)
    assert rig.metric("vlmcache_video_frames_total", tenant="A", hit_tier="response") == 12


def _misses(response) -> bool:
    """Neither the response nor the exact tier answered (the fake engine reports KV)."""
    statuses = response.json()["vlmcache"]["statuses"]
    return statuses["response"] == "miss" and statuses["exact_text"] == "miss"


def test_a_client_uuid_on_a_video_is_replaced(tmp_path):
    rig = Rig(tmp_path)
    body = video_chat("What moves?", clip_bytes(clip_frames()))
    body["messages"][0]["content"][0]["uuid"] = "someone-elses-clip"
    assert rig.post(body).status_code == 200
    assert rig.engine.bodies[0]["messages"][0]["content"][0]["uuid"].startswith("vlmc-")


@pytest.mark.parametrize("config, status, words", [
    ({"max_video_bytes": 1000}, 413, "max_video_bytes"),
    ({"max_video_pixels": 64 * 64}, 413, "max_video_pixels"),
    ({"max_video_duration_s": 0.5}, 413, "max_video_duration_s"),
    ({"max_video_frames": 4}, 413, "max_video_frames"),
    ({"max_videos_per_request": 1}, 400, "max_videos_per_request"),
])
def test_limits_name_the_field_and_nothing_reaches_the_engine(tmp_path, config, status, words):
    rig = Rig(tmp_path, **config)
    data = clip_bytes(clip_frames())
    r = rig.post(video_chat("What moves?", data, data))
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert words in err["message"] and err["param"].startswith("messages[0].content[")
    assert rig.engine.bodies == []


@pytest.mark.parametrize("url, words", [
    ("data:video/mp4;base64,aGVsbG8gd29ybGQ=", "cannot decode the video"),
    ("data:video/mp4;base64,@@@", "invalid base64"),
    ("data:video/mp4,plain", "must be base64"),
    ("https://example.com/clip.mp4", "remote video URLs are not accepted"),
    ("file:///etc/passwd", "unsupported video URL scheme"),
    ("data:video/jpeg;base64,AAAA", "video/jpeg frame lists"),
])
def test_a_bad_video_is_a_400_and_the_server_goes_on(tmp_path, url, words):
    rig = Rig(tmp_path)
    body = video_chat("What moves?", b"")
    body["messages"][0]["content"][0]["video_url"]["url"] = url
    r = rig.post(body)
    assert r.status_code == 400 and words in r.json()["error"]["message"], r.text
    assert r.json()["error"]["param"] == "messages[0].content[0].video_url"
    assert rig.engine.bodies == []
    assert rig.post(video_chat("What moves?", clip_bytes(clip_frames()))).status_code == 200


def test_a_video_part_with_only_a_uuid_is_refused(tmp_path):
    rig = Rig(tmp_path)
    body = video_chat("What moves?", b"")
    body["messages"][0]["content"][0] = {"type": "video_url", "uuid": "x"}
    r = rig.post(body)
    assert r.status_code == 400 and "must carry the video" in r.json()["error"]["message"]


def test_requests_whose_media_the_front_minted_are_marked_scoped(tmp_path):
    """vLLM hashes --media-io-kwargs into the uuid: the encoder-output tier may store the
    result only when the front minted every medium of the request."""
    rig = Rig(tmp_path)
    data = clip_bytes(clip_frames())
    rig.post(video_chat("What moves?", data, tenant="A"))
    audio = video_chat("What is said?", data, tenant="A")
    audio["messages"][0]["content"].append({"type": "input_audio", "input_audio": {
        "data": "AAAA", "format": "wav"}})
    rig.post(audio)
    flags = [b["kv_transfer_params"]["vlmcache"].get("scoped_media") for b in rig.engine.bodies]
    assert flags == [True, None]
    (tmp_path / "trust").mkdir()
    trusting = Rig(tmp_path / "trust", client_image_uuids="trust")
    trusting.post(video_chat("What moves?", data, tenant="A"))
    assert "scoped_media" not in trusting.engine.bodies[0]["kv_transfer_params"]["vlmcache"]


@pytest.mark.parametrize("model_type, mixes", [("qwen2_vl", True), ("llava_next_video", False),
                                               ("something_new", None)])
def test_the_report_says_whether_the_models_encoder_mixes_frames(tmp_path, model_type, mixes):
    import json

    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "config.json").write_text(json.dumps({"model_type": model_type}))
    rig = Rig(tmp_path)
    report = rig.post(video_chat("What moves?", clip_bytes(clip_frames()))).json()["vlmcache"]
    assert report["video_encoder_mixes_frames"] is mixes
    image_only = rig.post(chat("What is shown?", image(1))).json()["vlmcache"]
    assert image_only["video_encoder_mixes_frames"] is None


def test_a_clips_other_thumbnails_wait_until_it_is_answered(tmp_path, monkeypatch):
    """Only a lookup's frames are thumbnailed before the engine gets the request (the rest
    would take vLLM's API-server GIL from its own preparation of it); the rest start once
    the answer is out, then the frames are let go."""
    import time

    import vlmcache.tiers.video_thumbs as vt
    from vlmcache.serving.asgi import VlmCacheMiddleware

    made: list[int] = []
    real = vt.frame_thumbnails

    def counted(chunk):
        made.append(len(chunk))
        return real(chunk)

    monkeypatch.setattr(vt, "frame_thumbnails", counted)
    rig = Rig(tmp_path, enable_video_near_duplicates=True)
    at_engine: list[int] = []

    async def engine(scope, receive, send):
        at_engine.append(sum(made))
        await rig.engine(scope, receive, send)

    rig.app = VlmCacheMiddleware(engine, front=rig.front)
    clips = [clip_frames(seed, n=24) for seed in (1, 2)]
    for frames in clips:  # the second is looked up against the first
        response = rig.post(video_chat("What moves?", clip_bytes(frames), tenant="A"))
        assert response.status_code == 200, response.text
    first = len(vt.lookup_indices(24))
    assert at_engine[0] <= first and at_engine[1] <= 24 + first, (at_engine, made)
    deadline = time.monotonic() + 30
    while sum(made) < 48:  # the rest, after each answer
        assert time.monotonic() < deadline, made
        time.sleep(0.01)
