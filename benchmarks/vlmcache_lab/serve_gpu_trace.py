"""A seeded, realistic VQA serving trace for the GPU load benchmark (``serve_gpu``).

Kinds of request (``DEFAULT_MIX`` gives their shares; ``--mix`` changes them):

- ``repeat``: an earlier request again, byte for byte (same image bytes, question, params);
- ``jpeg``: a known image re-encoded as JPEG (quality 40-95), same question;
- ``frame``: a later "video frame" of a known image (its shapes moved 2-48 pixels);
- ``paraphrase``: a known image, a reworded known question in one of 8 framings;
- ``followup``: a known image, a question not asked on it yet;
- ``new``: a new image and question (tenant A);
- ``flood``: tenant B, a unique image each time (the flooding tenant).

Known pairs and images are drawn zipf-like (older = more popular). Answers are short
(8-32 tokens, ``ignore_eos`` so every request decodes exactly ``max_tokens``;
``skip_special_tokens`` off so that dummy weights' random tokens stream as text). Images are
synthetic scenes (gradient background, 2-5 shapes) rendered from the seed: nothing is
downloaded. :func:`composition` counts what a trace really holds, exact repeats by
signature (a paraphrase or JPEG drawn twice alike is an exact repeat too); once those would
take a trace past 25% exact repeats (the issue's bound, reached by long traces), such a
variant is drawn again, so a trace that never got there is the same as before the rule.
"""

from __future__ import annotations

import base64
import io
from dataclasses import dataclass
from functools import lru_cache
from typing import Any, Sequence

import numpy as np

KINDS = ("repeat", "jpeg", "frame", "paraphrase", "followup", "new", "flood")
# At most 25% exact repeats by default (the bound): 15% drawn, plus the few
# variants that happen to be drawn twice alike.
DEFAULT_MIX: dict[str, float] = {"repeat": 0.15, "jpeg": 0.12, "frame": 0.10,
                                 "paraphrase": 0.12, "followup": 0.16, "new": 0.15,
                                 "flood": 0.20}
NEEDS_KNOWN = {"repeat", "jpeg", "frame", "paraphrase", "followup"}
#: The issue's bound on exact repeats, which :func:`build_trace` keeps at any length, and
#: how often it draws a variant again that would cross it.
MAX_EXACT_REPEAT_SHARE = 0.25
REDRAWS = 8
#: Kinds that vary a known pair (a repeat is the pair itself).
VARIANTS = ("jpeg", "frame", "paraphrase")
#: Kinds whose answer an earlier request of the trace already holds (the same question on
#: the same image, re-sent, re-encoded, moved a little or reworded): all a cache could ever
#: answer without the model. The oracle arm (``--ours-layout oracle``) answers them at once.
ANSWERED_BEFORE = ("repeat", *VARIANTS)
IMAGE_SIDE = 336
# Paraphrases are a reworded question in one of these framings: enough distinct texts that
# a popular pair's paraphrases seldom repeat one another byte for byte.
FRAMINGS = ("{}", "quick question: {}", "please tell me, {}", "{} answer briefly.",
            "looking at this image, {}", "hey, {}", "i wonder, {}", "{} thanks!")

# (question, paraphrases): short VQA questions about the synthetic scenes.
QUESTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("what colour is the biggest shape?", ("which colour is the largest shape?",
     "what is the colour of the biggest shape?", "tell me the colour of the largest shape.")),
    ("how many shapes are in the picture?", ("how many shapes can you see?",
     "count the shapes in the image.", "what is the number of shapes shown?")),
    ("is there a circle in the image?", ("does the image contain a circle?",
     "can you see a circle?", "is a circle visible in the picture?")),
    ("what shape is in the top left?", ("which shape is at the top left?",
     "what is the shape in the upper left corner?", "name the shape in the top-left area.")),
    ("what colour is the background?", ("which colour is the background?",
     "describe the background colour.", "what is the colour behind the shapes?")),
    ("what colour is the smallest shape?", ("which colour is the smallest shape?",
     "tell me the colour of the smallest shape.", "what is the smallest shape's colour?")),
    ("are any shapes overlapping?", ("do any of the shapes overlap?",
     "is there overlap between shapes?", "do shapes in the image touch or overlap?")),
    ("which shape is closest to the centre?", ("what shape is nearest the centre?",
     "name the shape closest to the middle.", "which shape sits nearest the image centre?")),
)


@dataclass(frozen=True)
class ImageSpec:
    """How to render one image: scene ``base``, ``variant`` (png | jpeg | frame), its param."""

    base: int
    variant: str = "png"
    param: int = 0


@dataclass(frozen=True)
class TraceRequest:
    """One request of the trace."""

    kind: str
    tenant: str
    image: ImageSpec
    question: str
    max_tokens: int

    def signature(self) -> tuple[object, ...]:
        """What makes two requests exact repeats: image bytes, question, params, tenant."""
        return (self.tenant, self.image, self.question, self.max_tokens)

    def body(self, model: str, seed: int, stream: bool = True) -> dict[str, Any]:
        """The chat-completions body (streamed, deterministic, exactly ``max_tokens``)."""
        body: dict[str, Any] = {
            "model": model, "temperature": 0, "max_tokens": self.max_tokens,
            "ignore_eos": True, "skip_special_tokens": False, "cache_salt": self.tenant,
            "stream": stream,
            "messages": [{"role": "user", "content": [
                {"type": "image_url", "image_url": {"url": image_data_url(self.image, seed)}},
                {"type": "text", "text": self.question}]}]}
        if stream:
            # usage on every chunk: the first token is seen even when it streams as ""
            body["stream_options"] = {"include_usage": True, "continuous_usage_stats": True}
        return body


def parse_mix(text: str | None) -> dict[str, float]:
    """``"repeat=0.4,new=0.2"`` -> the default mix with those shares replaced, normalised."""
    mix = dict(DEFAULT_MIX)
    for item in (text or "").split(","):
        if not item.strip():
            continue
        key, _, value = item.partition("=")
        key = key.strip()
        if key not in KINDS:
            raise ValueError(f"--mix: unknown kind {key!r}; allowed: {', '.join(KINDS)}")
        try:
            mix[key] = float(value)
        except ValueError:
            raise ValueError(f"--mix: {key} needs a number, got {value!r}") from None
        if mix[key] < 0:
            raise ValueError(f"--mix: {key} must be >= 0, got {value}")
    total = sum(mix.values())
    if total <= 0:
        raise ValueError("--mix: the shares sum to 0")
    return {k: v / total for k, v in mix.items()}


class _TraceBuilder:
    """State of the generator: known images and (image, question) pairs, in order seen."""

    def __init__(self, seed: int, zipf_s: float) -> None:
        self.rng = np.random.default_rng(seed)
        self.zipf_s = zipf_s
        self.next_base = 0
        self.images: list[int] = []          # tenant A's images, oldest first
        self.asked: dict[int, set[int]] = {}  # image -> question ids asked on it
        self.pairs: list[TraceRequest] = []   # tenant A's first asks (png, canonical text)

    def _zipf(self, n: int) -> int:
        weights = 1.0 / np.arange(1, n + 1) ** self.zipf_s
        return int(self.rng.choice(n, p=weights / weights.sum()))

    def _new_base(self) -> int:
        self.next_base += 1
        return self.next_base - 1

    def _tokens(self) -> int:
        return int(self.rng.integers(8, 33))

    def make(self, kind: str) -> TraceRequest:
        if kind in NEEDS_KNOWN and not self.pairs:
            kind = "new"
        if kind == "flood":
            qid = int(self.rng.integers(len(QUESTIONS)))
            return TraceRequest(kind, "tenant-b", ImageSpec(self._new_base()),
                                QUESTIONS[qid][0], self._tokens())
        if kind == "new":
            return self._ask(kind, self._new_base(), int(self.rng.integers(len(QUESTIONS))))
        if kind == "followup":
            return self._followup()
        pair = self.pairs[self._zipf(len(self.pairs))]
        return self._variant(kind, pair)

    def _ask(self, kind: str, base: int, qid: int) -> TraceRequest:
        if base not in self.asked:
            self.images.append(base)
            self.asked[base] = set()
        self.asked[base].add(qid)
        req = TraceRequest(kind, "tenant-a", ImageSpec(base), QUESTIONS[qid][0], self._tokens())
        self.pairs.append(req)
        return req

    def _followup(self) -> TraceRequest:
        base = self.images[self._zipf(len(self.images))]
        left = [q for q in range(len(QUESTIONS)) if q not in self.asked[base]]
        if not left:  # every question asked on it: a new image instead
            return self._ask("new", self._new_base(), int(self.rng.integers(len(QUESTIONS))))
        return self._ask("followup", base, left[int(self.rng.integers(len(left)))])

    def _variant(self, kind: str, pair: TraceRequest) -> TraceRequest:
        if kind == "repeat":
            return TraceRequest(kind, pair.tenant, pair.image, pair.question, pair.max_tokens)
        if kind == "jpeg":
            image = ImageSpec(pair.image.base, "jpeg", int(self.rng.integers(40, 96)))
            return TraceRequest(kind, pair.tenant, image, pair.question, pair.max_tokens)
        if kind == "frame":
            image = ImageSpec(pair.image.base, "frame", int(self.rng.integers(1, 25)))
            return TraceRequest(kind, pair.tenant, image, pair.question, pair.max_tokens)
        qid = next(i for i, (q, _) in enumerate(QUESTIONS) if q == pair.question)
        alts = QUESTIONS[qid][1]
        text = FRAMINGS[int(self.rng.integers(len(FRAMINGS)))].format(
            alts[int(self.rng.integers(len(alts)))])
        return TraceRequest(kind, pair.tenant, pair.image, text, pair.max_tokens)


def build_trace(n: int, seed: int = 0, mix: dict[str, float] | None = None,
                zipf_s: float = 1.1) -> list[TraceRequest]:
    """``n`` requests drawn from ``mix`` (default :data:`DEFAULT_MIX`), reproducible from
    ``seed``; a kind that needs a known image falls back to ``new`` until one exists."""
    mix = mix or DEFAULT_MIX
    kinds = list(mix)
    p = np.array([mix[k] for k in kinds], dtype=float)
    builder = _TraceBuilder(seed, zipf_s)
    draws = builder.rng.choice(len(kinds), size=n, p=p / p.sum())
    trace: list[TraceRequest] = []
    seen: set[tuple[object, ...]] = set()
    repeats = 0
    for k in draws:
        req = builder.make(kinds[int(k)])
        # a variant drawn alike twice is an exact repeat too: past the bound, draw
        # it again (a long trace reaches it: 25.5% by 7,000 requests before this rule)
        for _ in range(REDRAWS):
            if not (req.kind in VARIANTS and req.signature() in seen
                    and repeats + 1 > MAX_EXACT_REPEAT_SHARE * (len(trace) + 1)):
                break
            req = builder.make(req.kind)
        repeats += req.signature() in seen
        seen.add(req.signature())
        trace.append(req)
    return trace


def composition(trace: Sequence[TraceRequest]) -> dict[str, Any]:
    """Counts per kind and tenant, and the exact repeats by signature."""
    seen: set[tuple[object, ...]] = set()
    repeats = 0
    kinds: dict[str, int] = {}
    tenants: dict[str, int] = {}
    for req in trace:
        sig = req.signature()
        repeats += sig in seen
        seen.add(sig)
        kinds[req.kind] = kinds.get(req.kind, 0) + 1
        tenants[req.tenant] = tenants.get(req.tenant, 0) + 1
    n = max(len(trace), 1)
    return {"requests": len(trace), "kinds": kinds, "tenants": tenants,
            "exact_repeats": repeats, "exact_repeat_share": round(repeats / n, 4),
            "distinct_images": len({r.image.base for r in trace}),
            "max_tokens_mean": round(float(np.mean([r.max_tokens for r in trace])), 2)
            if trace else None}


def render(spec: ImageSpec, seed: int) -> Any:
    """The scene of ``spec.base`` (PIL image); a ``frame`` moves its shapes 2*param px."""
    from PIL import Image, ImageDraw

    rng = np.random.default_rng([seed, spec.base])
    c0, c1 = rng.integers(0, 256, 3), rng.integers(0, 256, 3)
    t = np.linspace(0.0, 1.0, IMAGE_SIDE)[:, None, None]
    grad = (c0 * (1 - t) + c1 * t).astype(np.uint8)
    img = Image.fromarray(np.broadcast_to(grad, (IMAGE_SIDE, IMAGE_SIDE, 3)).copy())
    draw = ImageDraw.Draw(img)
    shift = 2 * spec.param if spec.variant == "frame" else 0
    for _ in range(int(rng.integers(2, 6))):
        x, y = (int(v) for v in rng.integers(0, IMAGE_SIDE - 60, 2))
        w, h = (int(v) for v in rng.integers(30, 120, 2))
        box = (x + shift, y, x + shift + w, y + h)
        fill = tuple(int(v) for v in rng.integers(0, 256, 3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)(box, fill=fill)
    return img


@lru_cache(maxsize=4096)
def image_data_url(spec: ImageSpec, seed: int) -> str:
    """``spec`` rendered and encoded (PNG, or JPEG at quality ``param``) as a data URL."""
    buf = io.BytesIO()
    img = render(spec, seed)
    if spec.variant == "jpeg":
        img.save(buf, format="JPEG", quality=spec.param)
        return "data:image/jpeg;base64," + base64.b64encode(buf.getvalue()).decode()
    img.save(buf, format="PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def poisson_offsets(rate: float, duration_s: float, rng: np.random.Generator) -> list[float]:
    """Arrival times (s from the phase start) of a Poisson process at ``rate`` per second,
    up to ``duration_s``."""
    if rate <= 0 or duration_s <= 0:
        raise ValueError(f"rate and duration must be > 0, got {rate}, {duration_s}")
    out: list[float] = []
    t = float(rng.exponential(1.0 / rate))
    while t < duration_s:
        out.append(t)
        t += float(rng.exponential(1.0 / rate))
    return out
