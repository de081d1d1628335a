"""vLLM's video decoding as the front calls it, on both vLLM layouts the project supports."""

import sys

import numpy as np
import pytest

from vlmcache.testing.clips import synthetic_frames, write_clip
from vlmcache.vllm import video_io

cv2 = pytest.importorskip("cv2")


def _clip() -> bytes:
    return write_clip(None, synthetic_frames(5, n=8, h=48, w=64), 4.0, "mp4v")


def test_probe_reads_the_container_through_vllms_stream_backend():
    assert video_io.probe_video(_clip())[:3] == (64, 48, 8.0)


def test_probe_finds_the_stream_backend_where_vllm_0_26_keeps_it(monkeypatch):
    """vLLM 0.26 has no ``video_decoders`` package; its mixin lives in
    ``vllm.multimodal.video``. ``CAP_ANY`` cannot open a byte stream (the GPU run's
    front refused every clip with it)."""
    from vllm.multimodal import video
    from vllm.multimodal.video_decoders.opencv import OpenCVVideoBackendMixin

    monkeypatch.setitem(sys.modules, "vllm.multimodal.video_decoders.opencv", None)
    monkeypatch.setattr(video, "OpenCVVideoBackendMixin", OpenCVVideoBackendMixin,
                        raising=False)
    assert video_io._stream_api(cv2) == OpenCVVideoBackendMixin.get_cv2_video_api()
    assert video_io.probe_video(_clip())[:3] == (64, 48, 8.0)


def test_undecodable_bytes_are_a_value_error():
    with pytest.raises(ValueError):
        video_io.probe_video(np.arange(4096, dtype=np.uint8).tobytes())
