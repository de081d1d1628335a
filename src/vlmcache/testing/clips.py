"""Small synthetic video clips for tests: draw, encode with OpenCV, wrap as data URLs.

Found on the vLLM-CPU machines (OpenCV 5.0 with its bundled FFmpeg, no libx264), decoding
with vLLM's own loader (``VideoMediaIO``, OpenCV backend):

* lossless, bit-exact RGB round trip: ``ffv1`` (FFV1 in AVI), ``ffv1-mp4`` (FFV1 in MP4),
  ``huffyuv`` (HFYU in AVI), ``png`` (PNG frames in AVI), ``raw`` (BGRA in AVI);
* lossy (YUV 4:2:0 and/or DCT): ``mp4v`` (MPEG-4 Part 2 in MP4), ``mjpg`` (Motion JPEG
  in AVI). H.264 (``avc1``/``H264``) cannot be written here;
* AVI and MP4 output is byte-identical across runs; Matroska and WebM are not (the muxer
  writes a random segment UID and a date), so no preset uses them.
"""

from __future__ import annotations

import base64
import os
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np

__all__ = ["CODECS", "Codec", "decode_clip", "synthetic_frames", "video_data_url", "write_clip"]


class Codec(NamedTuple):
    """An OpenCV fourcc + container pair, its MIME type, and whether decoding is bit-exact."""

    fourcc: str
    suffix: str
    mime: str
    lossless: bool


CODECS: dict[str, Codec] = {
    "mp4v": Codec("mp4v", ".mp4", "video/mp4", False),
    "mjpg": Codec("MJPG", ".avi", "video/x-msvideo", False),
    "ffv1": Codec("FFV1", ".avi", "video/x-msvideo", True),
    "ffv1-mp4": Codec("FFV1", ".mp4", "video/mp4", True),
    "huffyuv": Codec("HFYU", ".avi", "video/x-msvideo", True),
    "png": Codec("png ", ".avi", "video/x-msvideo", True),
    "raw": Codec("RGBA", ".avi", "video/x-msvideo", True),
}


def synthetic_frames(seed: int, n: int = 8, h: int = 128, w: int = 128) -> np.ndarray:
    """``(n, h, w, 3)`` uint8 RGB frames: a gradient background and 3-5 moving shapes.

    Deterministic in ``seed`` (numpy + OpenCV drawing only). Each shape moves with its own
    velocity and bounces off the edges, so consecutive frames differ and the clip as a
    whole differs from any single frame repeated.
    """
    import cv2

    rng = np.random.default_rng([0x71D_E0, int(seed)])
    gy = np.linspace(0.0, 1.0, h)[:, None, None]
    gx = np.linspace(0.0, 1.0, w)[None, :, None]
    tint = rng.integers(-80, 81, size=(2, 3))
    bg = np.clip(rng.integers(40, 216, size=3) + gy * tint[0] + gx * tint[1], 0, 255)
    bg = bg.astype(np.uint8)
    shapes = []
    for _ in range(int(rng.integers(3, 6))):
        size = int(rng.integers(max(4, min(h, w) // 10), max(5, min(h, w) // 4)))
        pos = rng.uniform([0, 0], [w - size, h - size])
        vel = rng.uniform(-0.08, 0.08, size=2) * (w, h)  # up to 8% of the frame per frame
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        shapes.append((int(rng.integers(0, 2)), size, pos, vel, colour))
    frames = np.empty((n, h, w, 3), dtype=np.uint8)
    for t in range(n):
        img = bg.copy()
        for kind, size, pos, vel, colour in shapes:
            x, y = (_bounce(p + v * t, hi - size) for p, v, hi in zip(pos, vel, (w, h)))
            if kind == 0:
                cv2.rectangle(img, (x, y), (x + size, y + size), colour, thickness=-1)
            else:
                r = size // 2
                cv2.circle(img, (x + r, y + r), r, colour, thickness=-1)
        frames[t] = img
    return frames


def _bounce(p: float, hi: int) -> int:
    # Reflect a position into [0, hi] so shapes stay in frame however long the clip is.
    period = 2 * max(hi, 1)
    q = p % period
    return int(q if q <= hi else period - q)


def write_clip(
    path: str | os.PathLike | None, frames: np.ndarray, fps: float = 4.0, codec: str = "mp4v"
) -> bytes:
    """Encode RGB ``frames`` ``(T, H, W, 3)`` uint8 with OpenCV; return the file's bytes.

    ``codec`` names a ``CODECS`` preset (fourcc + container). With ``path`` the bytes are
    also written there (whatever its suffix: the container is the preset's). Raises
    ValueError for an unknown preset or bad frames, RuntimeError if OpenCV cannot encode.
    """
    import cv2

    if codec not in CODECS:
        raise ValueError(f"unknown codec {codec!r}; choose from {sorted(CODECS)}")
    frames = np.asarray(frames)
    if frames.ndim != 4 or frames.shape[-1] != 3 or frames.dtype != np.uint8 or not len(frames):
        raise ValueError(f"frames must be (T, H, W, 3) uint8, got {frames.shape} {frames.dtype}")
    spec = CODECS[codec]
    _, h, w, _ = frames.shape
    # OpenCV's FFmpeg writer needs a real file; its container follows the file's suffix.
    with tempfile.TemporaryDirectory(prefix="vlmcache-clip-") as tmp:
        out = Path(tmp) / f"clip{spec.suffix}"
        writer = cv2.VideoWriter(str(out), cv2.CAP_FFMPEG, cv2.VideoWriter_fourcc(*spec.fourcc),
                                 float(fps), (w, h))
        if not writer.isOpened():
            raise RuntimeError(f"OpenCV cannot write {spec.fourcc!r} into {spec.suffix}")
        try:
            for frame in frames:
                writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))  # OpenCV wants BGR
        finally:
            writer.release()
        data = out.read_bytes()
    if path is not None:
        Path(path).write_bytes(data)
    return data


def decode_clip(data: bytes) -> np.ndarray:
    """All frames of an encoded clip as ``(T, H, W, 3)`` uint8 RGB, read the way vLLM's
    OpenCV video loader reads them (``cv2.VideoCapture`` on an in-memory stream)."""
    import io

    import cv2

    # Keep a reference to the stream: the capture does not, and reading from (or releasing
    # the capture after) a collected stream segfaults.
    stream = io.BytesIO(data)
    cap = cv2.VideoCapture(stream, cv2.CAP_FFMPEG, [])
    if not cap.isOpened():
        raise ValueError("OpenCV could not open the clip")
    frames = []
    try:
        while True:
            ok, frame = cap.read()
            if not ok:
                break
            frames.append(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
    finally:
        cap.release()
        del stream
    return np.stack(frames) if frames else np.empty((0, 0, 0, 3), np.uint8)


def video_data_url(data: bytes, mime: str = "video/mp4") -> str:
    """A ``data:<mime>;base64,...`` URL for a ``video_url`` chat content part."""
    return f"data:{mime};base64,{base64.b64encode(data).decode('ascii')}"
