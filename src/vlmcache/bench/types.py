"""The records ``vlmcache bench`` passes between its stages.

dataset (``Sample``) -> workloads (``BenchRequest``) -> harness, one engine per mode
(``RequestResult``) -> summary, tables and plots. Requests are rebuilt deterministically in
every mode's process from the same arguments, so they carry image *references* (a file and
a transform), not pixels.
"""

from __future__ import annotations

import io
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Sample:
    """One dataset item: an image file, a question and (if known) its answer."""

    image_path: Path
    question: str
    answer: str | None
    image_id: str  # stable id: dataset id or file stem


@dataclass(frozen=True)
class ImageRef:
    """An image file plus a deterministic transform (near-duplicates, video frames).

    ``shift``: (dx, dy) pixels, wrapped around (a moving scene); ``noise_sigma`` with
    ``noise_seed``: Gaussian pixel noise; ``jpeg_quality``: a JPEG re-encode.
    """

    path: str
    shift: tuple[int, int] = (0, 0)
    noise_sigma: float = 0.0
    noise_seed: int = 0
    jpeg_quality: int | None = None

    @property
    def id(self) -> str:
        """Equal ids mean equal pixels."""
        parts = [Path(self.path).name]
        if self.shift != (0, 0):
            parts.append(f"shift{self.shift[0]},{self.shift[1]}")
        if self.noise_sigma:
            parts.append(f"noise{self.noise_sigma:g}s{self.noise_seed}")
        if self.jpeg_quality is not None:
            parts.append(f"jpeg{self.jpeg_quality}")
        return ":".join(parts)

    @property
    def transformed(self) -> bool:
        return self.id != Path(self.path).name

    def load(self) -> Any:
        """The image as an RGB ``PIL.Image`` with the transform applied."""
        import numpy as np
        from PIL import Image, ImageChops

        with Image.open(self.path) as im:
            image = im.convert("RGB")
        if self.shift != (0, 0):
            image = ImageChops.offset(image, *self.shift)
        if self.noise_sigma:
            rng = np.random.default_rng(self.noise_seed)
            arr = np.asarray(image).astype(np.float32)
            arr = np.clip(arr + rng.normal(0, self.noise_sigma, arr.shape), 0, 255)
            image = Image.fromarray(arr.astype(np.uint8))
        if self.jpeg_quality is not None:
            buf = io.BytesIO()
            image.save(buf, "JPEG", quality=self.jpeg_quality)
            image = Image.open(io.BytesIO(buf.getvalue())).convert("RGB")
        return image


@dataclass(frozen=True)
class BenchRequest:
    """One request of a run; the same list is replayed in every mode.

    ``question`` is what is asked (maybe a paraphrase); ``meaning`` the dataset question it
    rewords (its ``answer`` is the ground truth). ``restart_before``: the harness closes the
    engine and starts a new one (same store) before this request.
    """

    index: int
    workload: str  # zipf | paraphrase | near_dup | tenants | restart
    image: ImageRef
    question: str
    answer: str | None
    tenant: str | None = None
    meaning: str = ""
    restart_before: bool = False
    expect_reuse: bool = False  # a cache could legitimately serve it (seen before, or similar)

    @property
    def template_question(self) -> str:
        return self.meaning or self.question

    @property
    def medium_id(self) -> str:
        """What the request asks about (``RequestResult.image_id``)."""
        return self.image.id


@dataclass
class RequestResult:
    """What one mode did with one request."""

    mode: str
    index: int
    workload: str
    tenant: str | None
    image_id: str  # the medium asked about: an image's id, or a clip's (video workload)
    question: str
    answer_gt: str | None
    output: str  # the normalized answer text
    latency_ms: float
    ttft_ms: float | None
    prompt_tokens: int
    tokens_loaded: int  # from vlmcache's store
    tokens_prefix_cache: int  # vLLM's own prefix cache
    tokens_computed: int
    hit_tier: str | None
    statuses: dict[str, str] = field(default_factory=dict)
    similarity: float | None = None
    images_loaded: int = 0  # encoder outputs loaded (L1.5)
    images_encoded: int = 0
    after_restart: bool = False  # the first request of a restarted engine
    log_line: str = ""
    candidates: dict[str, float] = field(default_factory=dict)  # sweep: best score per key
    # per key ("image", "text"): what a hit on that candidate would answer (the answer this
    # mode gave the cached request it points to) and that request's true answer
    candidate_answers: dict[str, str] = field(default_factory=dict)
    candidate_gts: dict[str, str | None] = field(default_factory=dict)

    @property
    def correct(self) -> bool | None:
        return None if self.answer_gt is None else self.output == self.answer_gt

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "RequestResult":
        return cls(**data)
