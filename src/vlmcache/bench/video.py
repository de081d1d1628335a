"""The ``video`` workload of ``vlmcache bench``: a seeded trace of synthetic clips on the
built-in tiny LLaVA-NeXT-Video.

Each clip (16 frames of moving shapes, 4 fps; the engine samples ``SAMPLED_FRAMES`` of them)
is asked about in one group of requests, in this order (the request's ``workload``):

* ``first``: tenant-0 asks about a new clip (lossless FFV1): nothing can be reused;
* ``repeat``: the same bytes and question again;
* ``remux``: the same frames in another lossless container (HuffYUV or PNG in AVI);
* ``reencode``: a lossy MPEG-4 re-encode (mp4v): only a near-duplicate tier can reuse it;
* ``follow_up``: another question on the clip as first sent (its video tokens come first
  in the prompt, so they can be reused);
* ``changed``: the clip with an object drawn into its last frame (a frame the sampling
  always takes), re-encoded with mp4v: another video, which must be computed;
* ``tenant``: another tenant asks the first request: tenants share nothing.

The trace is deterministic in ``seed`` (clip seeds drawn from numpy's ``default_rng``) and
carries clip *references*: every mode's process rebuilds the same bytes.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from vlmcache.errors import ConfigError

KINDS = ("first", "repeat", "remux", "reencode", "follow_up", "changed", "tenant")
CLIP_FRAMES = 16
SAMPLED_FRAMES = 8  # 64 tokens each on the tiny model: 512 video tokens per request
FPS = 4.0
REMUX_CODECS = ("huffyuv", "png")
BUILTIN_VIDEO_MODEL = "builtin:tiny-video"


@dataclass(frozen=True)
class ClipRef:
    """A synthetic clip: its frames' seed, the codec it is encoded with, and whether an
    object was drawn into its last frame. Equal ids mean equal bytes."""

    seed: int
    codec: str = "ffv1"
    changed: bool = False

    @property
    def id(self) -> str:
        return f"clip{self.seed}:{self.codec}" + (":changed" if self.changed else "")

    def load(self) -> bytes:
        """The encoded clip (OpenCV writes AVI and MP4 byte-identically across runs)."""
        from vlmcache.testing.clips import synthetic_frames, write_clip

        frames = synthetic_frames(self.seed, n=CLIP_FRAMES)
        if self.changed:
            frames = frames.copy()
            frames[-1, 40:90, 40:90] = (250, 250, 20)
        return write_clip(None, frames, FPS, self.codec)


@dataclass(frozen=True)
class VideoBenchRequest:
    """One request of the video trace (the fields the harness reads of a request)."""

    index: int
    workload: str  # one of KINDS
    clip: ClipRef
    question: str
    tenant: str
    answer: str | None = None  # synthetic clips have no ground truth
    restart_before: bool = False
    expect_reuse: bool = False

    @property
    def medium_id(self) -> str:
        return self.clip.id


def video_questions() -> tuple[str, str]:
    """(the question every group asks first, the follow-up question)."""
    from vlmcache.testing.tiny_video import VIDEO_QUESTIONS

    return VIDEO_QUESTIONS[0], VIDEO_QUESTIONS[1]


#: the kinds a cache could legitimately serve (the clip, or its video tokens, seen before)
REUSABLE = ("repeat", "remux", "reencode", "follow_up")


def build_video_requests(n: int, seed: int, tenants: int = 2) -> list[VideoBenchRequest]:
    """``n`` requests: groups of ``KINDS`` (the last group cut short), one new clip each;
    the ``tenant`` request of group ``g`` comes from tenant ``1 + g % (tenants - 1)``."""
    if n < 1:
        raise ConfigError(f"--n must be >= 1, got {n}")
    if tenants < 2:
        raise ConfigError(f"the video workload needs --tenants >= 2, got {tenants}")
    rng = np.random.default_rng([seed % 2**63, 0x71DE0])
    out: list[VideoBenchRequest] = []
    for g in range(-(-n // len(KINDS))):
        out.extend(_group(ClipRef(int(rng.integers(0, 2**31))), g, tenants))
    return [dataclasses.replace(req, index=i) for i, req in enumerate(out[:n])]


def _group(clip: ClipRef, g: int, tenants: int) -> list[VideoBenchRequest]:
    """Group ``g``'s requests about ``clip``, one per kind, in ``KINDS`` order."""
    ask, follow = video_questions()
    first = "tenant-0"
    plan = (("first", clip, ask, first), ("repeat", clip, ask, first),
            ("remux", dataclasses.replace(clip, codec=REMUX_CODECS[g % 2]), ask, first),
            ("reencode", dataclasses.replace(clip, codec="mp4v"), ask, first),
            ("follow_up", clip, follow, first),
            ("changed", dataclasses.replace(clip, codec="mp4v", changed=True), ask, first),
            ("tenant", clip, ask, f"tenant-{1 + g % (tenants - 1)}"))
    return [VideoBenchRequest(0, kind, ref, question, tenant, expect_reuse=kind in REUSABLE)
            for kind, ref, question, tenant in plan]


def video_engine_args() -> dict[str, object]:
    """Engine settings the video trace needs on top of the bench's shared ones."""
    return {"max_model_len": 1024, "limit_mm_per_prompt": {"video": 1},
            "media_io_kwargs": {"video": {"num_frames": SAMPLED_FRAMES}}}
