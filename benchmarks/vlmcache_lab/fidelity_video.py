"""Video probes of the fidelity benchmark, through the front's own video pipeline.

Each clip and variant (:mod:`vlmcache_lab.fidelity_clips`) goes as a data URL through
:func:`vlmcache.serving.videos.decode_video_url` (vLLM's loader, the server's fixed
``num_frames`` sampling, the limits, :func:`~vlmcache.keys.video_content_hash` and the
verifier thumbnails), then as the cascade does: an identity already served is an exact
hit; otherwise :class:`~vlmcache.tiers.video.VideoTier` is asked, and a video it does not
match is recorded as canonical (``Cascade.remember``). Seeds (the clips as served) go
first, then each clip's variants. No VLM answers here (tiny-vqa reads no video): the
outcome is which clip a variant was canonicalized to.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from vlmcache_lab.fidelity_clips import NUM_FRAMES, Clip, encode, variants
from vlmcache_lab.fidelity_data import Probe, ShapeAttrs

VIDEO = ShapeAttrs("video", "?")  # clips have no easy-vqa ground truth
TENANT = "fidelity"
_MIME = {b"RIFF": "video/x-msvideo"}


def _decode(data: bytes):
    """The front's decode of one clip (a :class:`~vlmcache.serving.videos.DecodedVideo`)."""
    from vlmcache.serving.videos import VideoLimits, decode_video_url
    from vlmcache.testing.clips import video_data_url
    from vlmcache.vllm.video_io import VideoSampling, video_kwargs

    sampling = VideoSampling({"video": {"num_frames": NUM_FRAMES}})
    limits = VideoLimits(max_bytes=64 * 1024**2, max_frames=64, max_pixels=1920 * 1080,
                         max_duration_s=60.0, remote="refuse", timeout_s=5.0)
    url = video_data_url(data, _MIME.get(data[:4], "video/mp4"))
    return decode_video_url(url, "video", limits, sampling, video_kwargs(sampling, None),
                            None), url


class VideoRun:
    """The cascade's video path for one tenant: exact identities, then the tier."""

    def __init__(self, threshold: float) -> None:
        from vlmcache.tiers.video import VideoTier

        self.tier = VideoTier(threshold, 512 * 1024**2)
        self.owner: dict[str, str] = {}  # canonical identity -> the clip or variant id

    def resolve(self, data: bytes, clip_id: str) -> tuple[str | None, str | None, tuple]:
        """(hit tier, the id canonicalized to, sampled frame indices) of one request;
        a miss makes it canonical."""
        from vlmcache.tiers.video import VideoQuery

        decoded, url = _decode(data)
        query = VideoQuery(decoded.content_hash, decoded.signature, decoded.thumbs, url)
        indices = decoded.signature.frame_indices
        if decoded.content_hash in self.owner:
            return "exact", self.owner[decoded.content_hash], indices
        match = self.tier.lookup(query, TENANT)
        if match is not None:
            return "video", self.owner[match.canonical_hash], indices
        self.tier.record(query, TENANT)
        self.owner[decoded.content_hash] = clip_id
        return None, None, indices


def run_videos(clips: Sequence[Clip], threshold: float, seed: int = 0) -> list:
    """Rows (:class:`vlmcache_lab.fidelity.Row`) of every clip's seed and variants."""
    from vlmcache_lab.fidelity import Row

    rng = np.random.default_rng([seed, 34])
    run, rows, served = VideoRun(threshold), [], {}
    for clip in clips:
        data = encode(clip.frames())
        tier, canon, indices = run.resolve(data, clip.clip_id)
        served[clip.clip_id] = (data, indices)
        rows.append(Row(Probe("seed", None, "", VIDEO, clip.clip_id, False,
                              source=clip.clip_id), hit_tier=tier, canonical_image=canon))
    for clip in clips:
        data, indices = served[clip.clip_id]
        for kind, variant in variants(clip, data, indices, rng).items():
            probe_id = f"{clip.clip_id}:{kind}"
            tier, canon, _ = run.resolve(variant, probe_id)
            rows.append(Row(Probe(kind, None, "", VIDEO, probe_id, "benign" in kind,
                                  source=clip.clip_id), hit_tier=tier, canonical_image=canon))
    return rows
