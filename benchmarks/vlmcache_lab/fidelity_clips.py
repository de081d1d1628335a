"""Video clips for the fidelity benchmark and their variants, as encoded bytes.

Two kinds of clip, each a renderer ``render(start, n) -> (n, H, W, 3) uint8`` so that a
clip can be re-rendered from a later frame (a clip shifted by one frame) or continued:

- synthetic: :func:`vlmcache.testing.clips.synthetic_frames` (moving shapes on a
  gradient), split by seed;
- photographic: a camera window panning and zooming across a real photograph
  (:mod:`vlmcache_lab.fidelity_photos`, split by photograph) with a few objects moving
  over it.

A clip is served as an MPEG-4 Part 2 file (``mp4v``, the common lossy upload). Benign
variants: re-encoded (decoded, then OpenCV's own Motion-JPEG writer at quality 90 and 30:
the FFmpeg writers here ignore ``VIDEOWRITER_PROP_QUALITY``, this one honours it), re-muxed
(the same frames through the same MPEG-4 encoder into AVI: OpenCV cannot copy a stream
between containers; most decode bit-identically), the source frames in another
codec and container (Motion JPEG in AVI) and the source resized (0.75x or 1.5x). Hard
negatives: an object in one sampled frame, an object appearing in the last frame, the
frames reversed, the clip started one frame later, trimmed (its last quarter cut), and
another clip of the same scene (another camera path over the photograph, with its objects
elsewhere; the synthetic scene's next frames).
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Optional

import numpy as np

from vlmcache.testing.clips import decode_clip, synthetic_frames, write_clip

FRAMES = 24  # 3 s at 8 fps
FPS = 8.0
SIZE = (160, 120)  # width, height
NUM_FRAMES = 8  # the server's sampling (--media-io-kwargs '{"video": {"num_frames": 8}}')
REENCODE_QUALITIES = (90, 30)

Render = Callable[[int, int], np.ndarray]


@dataclass(frozen=True)
class Clip:
    """A clip: its id, its renderer, and a renderer of another clip of the same scene."""

    clip_id: str
    render: Render
    same_scene: Render

    def frames(self) -> np.ndarray:
        return self.render(0, FRAMES)


def synthetic_clip(seed: int) -> Clip:
    """Moving shapes (seeded); the same scene continued is its next ``FRAMES`` frames."""
    h, w = SIZE[1], SIZE[0]

    def render(start: int, n: int) -> np.ndarray:
        return synthetic_frames(seed, start + n, h, w)[start:]

    return Clip(f"syn{seed}", render, lambda start, n: render(start + FRAMES, n))


@dataclass(frozen=True)
class _Camera:
    """A window (4:3) over the photograph: centre and height in pixels, per frame."""

    cx: float
    cy: float
    height: float
    vx: float
    vy: float
    zoom: float  # height change per frame (share)


def _camera(photo_size: tuple[int, int], rng: np.random.Generator) -> _Camera:
    """A window of 45-70% of the photograph's height that pans 10-25% of its width over
    the clip and zooms in or out by up to 12%."""
    w, h = photo_size
    height = h * float(rng.uniform(0.45, 0.70))
    pan = w * float(rng.uniform(0.10, 0.25)) / FRAMES
    angle = float(rng.uniform(0, 2 * np.pi))
    zoom = float(rng.uniform(-0.12, 0.12)) / FRAMES
    margin_x, margin_y = height * 2 / 3 * 1.2, height / 2 * 1.2
    cx = float(rng.uniform(margin_x, max(margin_x + 1, w - margin_x)))
    cy = float(rng.uniform(margin_y, max(margin_y + 1, h - margin_y)))
    return _Camera(cx, cy, height, pan * np.cos(angle), pan * np.sin(angle), zoom)


def _objects(rng: np.random.Generator) -> list[tuple[int, float, np.ndarray, np.ndarray, tuple]]:
    """2-3 objects (disc or box) in frame coordinates: kind, radius, position, velocity,
    colour."""
    out = []
    for _ in range(int(rng.integers(2, 4))):
        r = float(rng.uniform(0.07, 0.13)) * SIZE[1]
        pos = rng.uniform([r, r], [SIZE[0] - r, SIZE[1] - r])
        vel = rng.uniform(-0.015, 0.015, 2) * SIZE[0]
        out.append((int(rng.integers(2)), r, pos, vel,
                    tuple(int(c) for c in rng.integers(0, 256, 3))))
    return out


def _view(photo: np.ndarray, cam: _Camera, t: float) -> np.ndarray:
    """Frame ``t`` of the camera: the window resampled to ``SIZE`` (reflecting the
    photograph's edge if a window ever reaches past it)."""
    import cv2

    height = cam.height * (1 + cam.zoom * t)
    scale = height / SIZE[1]
    x0 = cam.cx + cam.vx * t - scale * SIZE[0] / 2
    y0 = cam.cy + cam.vy * t - scale * SIZE[1] / 2
    to_photo = np.array([[scale, 0, x0], [0, scale, y0]], np.float64)
    return cv2.warpAffine(photo, to_photo, SIZE, flags=cv2.INTER_AREA | cv2.WARP_INVERSE_MAP,
                          borderMode=cv2.BORDER_REFLECT)


def draw_object(frame: np.ndarray, kind: int, r: float, pos: Any, colour: tuple) -> None:
    """A filled disc or box with a dark outline (in place)."""
    import cv2

    x, y = int(round(pos[0])), int(round(pos[1]))
    ri = int(round(r))
    if kind == 0:
        cv2.circle(frame, (x, y), ri, colour, thickness=-1, lineType=cv2.LINE_AA)
        cv2.circle(frame, (x, y), ri, (20, 20, 20), thickness=1, lineType=cv2.LINE_AA)
    else:
        cv2.rectangle(frame, (x - ri, y - ri), (x + ri, y + ri), colour, thickness=-1)
        cv2.rectangle(frame, (x - ri, y - ri), (x + ri, y + ri), (20, 20, 20), thickness=1)


def _photo_render(photo: np.ndarray, cam: _Camera, objects: list) -> Render:
    def render(start: int, n: int) -> np.ndarray:
        out = np.empty((n, SIZE[1], SIZE[0], 3), np.uint8)
        for k, t in enumerate(range(start, start + n)):
            frame = np.ascontiguousarray(_view(photo, cam, t))
            for kind, r, pos, vel, colour in objects:
                p = pos + vel * t
                p = np.abs((p + np.array(SIZE)) % (2 * np.array(SIZE)) - np.array(SIZE))
                draw_object(frame, kind, r, p, colour)  # bounces off the frame's edges
            out[k] = frame
        return out

    return render


def photo_clip(name: str, photo: Any, k: int, seed: int) -> Clip:
    """Clip ``k`` of a photograph: a camera path and objects from ``(seed, name, k)``;
    its same-scene twin has another path and objects over the same photograph."""
    arr = np.ascontiguousarray(np.asarray(photo.convert("RGB"), np.uint8))
    rng = np.random.default_rng([seed, sum(map(ord, name)), k])
    main = _photo_render(arr, _camera(photo.size, rng), _objects(rng))
    twin = _photo_render(arr, _camera(photo.size, rng), _objects(rng))
    return Clip(f"{name}{k}", main, twin)


def encode(frames: np.ndarray, codec: str = "mp4v") -> bytes:
    """``frames`` as a clip file: a :data:`vlmcache.testing.clips.CODECS` preset, or
    ``mp4v-avi`` (MPEG-4 Part 2 in AVI) or ``mjpeg-q<N>`` (OpenCV's Motion-JPEG writer at
    quality N)."""
    if codec == "mp4v-avi":
        return _opencv_write(frames, "mp4v", ".avi", None)
    if codec.startswith("mjpeg-q"):
        return _opencv_write(frames, "MJPG", ".avi", int(codec[len("mjpeg-q"):]))
    return write_clip(None, frames, FPS, codec)


def _opencv_write(frames: np.ndarray, fourcc: str, suffix: str, quality: Optional[int]) -> bytes:
    import cv2

    h, w = frames.shape[1:3]
    # quality: only OpenCV's built-in MJPEG writer takes it (after opening)
    api = cv2.CAP_OPENCV_MJPEG if quality is not None else cv2.CAP_FFMPEG
    with tempfile.TemporaryDirectory(prefix="vlmcache-fidelity-") as tmp:
        out = Path(tmp) / f"clip{suffix}"
        writer = cv2.VideoWriter(str(out), api, cv2.VideoWriter_fourcc(*fourcc), FPS, (w, h))
        if not writer.isOpened():
            raise RuntimeError(f"OpenCV cannot write {fourcc!r} into {suffix}")
        if quality is not None and not writer.set(cv2.VIDEOWRITER_PROP_QUALITY, quality):
            raise RuntimeError("OpenCV's MJPEG writer refused the quality setting")
        for frame in frames:
            writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
        writer.release()
        return out.read_bytes()


def _resized(frames: np.ndarray, factor: float) -> np.ndarray:
    import cv2

    w, h = (int(round(s * factor / 2)) * 2 for s in SIZE)  # even sides for MPEG-4
    return np.stack([cv2.resize(f, (w, h), interpolation=cv2.INTER_AREA) for f in frames])


def _with_object(frames: np.ndarray, index: int, rng: np.random.Generator) -> np.ndarray:
    """A copy with a new object (18-25% of the frame's height) in frame ``index``."""
    out = frames.copy()
    r = float(rng.uniform(0.09, 0.125)) * SIZE[1]
    pos = rng.uniform([r, r], [SIZE[0] - r, SIZE[1] - r])
    frame = np.ascontiguousarray(out[index])
    draw_object(frame, int(rng.integers(2)), r, pos,
                tuple(int(c) for c in rng.integers(0, 256, 3)))
    out[index] = frame
    return out


def variants(clip: Clip, seed_bytes: bytes, sampled: tuple[int, ...],
             rng: np.random.Generator) -> dict[str, bytes]:
    """Every variant kind of ``clip`` (served as ``seed_bytes``; ``sampled``: the source
    frame indices the server's sampling takes) as encoded bytes."""
    frames = clip.frames()
    decoded = decode_clip(seed_bytes)
    middle = sampled[len(sampled) // 2]
    out = {f"video:benign_reencode_q{q}": encode(decoded, f"mjpeg-q{q}")
           for q in REENCODE_QUALITIES}
    out["video:benign_remux"] = encode(frames, "mp4v-avi")
    out["video:benign_other_codec"] = encode(frames, "mjpg")
    out["video:benign_resized"] = encode(_resized(frames, float(rng.choice([0.75, 1.5]))))
    out["video:hard_one_frame"] = encode(_with_object(frames, middle, rng))
    out["video:hard_object_last_frame"] = encode(_with_object(frames, FRAMES - 1, rng))
    out["video:hard_reversed"] = encode(frames[::-1].copy())
    out["video:hard_shifted"] = encode(clip.render(1, FRAMES))
    out["video:hard_trimmed"] = encode(frames[: FRAMES - FRAMES // 4].copy())
    out["video:hard_other_clip_same_scene"] = encode(clip.same_scene(0, FRAMES))
    return out


def clips(split: str, n: int, seed: int = 0) -> list[Clip]:
    """``n`` clips of ``split``: half synthetic (test seeds 0.., train seeds 1000..), half
    over the split's photographs (in turn)."""
    from vlmcache_lab.fidelity_photos import load_photo, photo_split

    base = 0 if split == "test" else 1000
    names = photo_split(split)
    photos = {name: load_photo(name) for name in names}
    out = [synthetic_clip(base + k) for k in range((n + 1) // 2)]
    for k in range(n // 2):
        name = names[k % len(names)]
        out.append(photo_clip(name, photos[name], k // len(names), seed))
    return out

