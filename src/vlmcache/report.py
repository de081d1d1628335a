"""The per-request ReuseReport: what was reused, from where, and how similar it was."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from vlmcache.cascade import RESPONSE_TIER, STATUS_ORDER, Resolution, TierStatus
from vlmcache.keys import KVRowKeys


def _opt_str(value: object) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class KVReuse:
    """What the KV connector did for one request (from vLLM's ``kv_transfer_params``)."""

    prompt_tokens: int = 0
    tokens_loaded: int = 0
    tokens_from_prefix_cache: int = 0
    blocks_saved: int = 0
    load_failed_blocks: int = 0
    row_keys: KVRowKeys = field(default_factory=KVRowKeys, repr=False)
    bypass: bool = False
    cost_model_choice: str | None = None  # issue 11: "load"/"skip" of the persistent tier
    cost_model_reason: str | None = None  # issue 11

    @classmethod
    def from_params(cls, params: Mapping[str, object] | None) -> "KVReuse | None":
        """Parse the connector's ``kv_transfer_params["vlmcache"]``; ``None`` if absent."""
        if not isinstance(params, Mapping):
            return None
        ours = params.get("vlmcache")
        if not isinstance(ours, Mapping):
            return None

        def num(name: str) -> int:
            value = ours.get(name, 0)
            return int(value) if isinstance(value, (int, float)) else 0

        return cls(prompt_tokens=num("prompt_tokens"), tokens_loaded=num("tokens_loaded"),
                   tokens_from_prefix_cache=num("tokens_from_prefix_cache"),
                   blocks_saved=num("blocks_saved"),
                   load_failed_blocks=num("load_failed_blocks"),
                   row_keys=KVRowKeys.from_params(ours),
                   bypass=bool(ours.get("bypass", False)),
                   cost_model_choice=_opt_str(ours.get("cost_model_choice")),  # issue 11
                   cost_model_reason=_opt_str(ours.get("cost_model_reason")))


@dataclass(frozen=True)
class EncoderReuse:
    """What the encoder-output tier did for one request (vLLM's ``ec_transfer_params``)."""

    items: int
    loaded: int
    computed: int

    @property
    def status(self) -> TierStatus:
        """``hit`` if any image's encoder output came from the store; ``miss`` if the
        encoder ran; ``skip`` when no image needed encoding (no images, or the KV of the
        image tokens was reused)."""
        if self.loaded:
            return "hit"
        return "miss" if self.computed else "skip"

    @classmethod
    def from_params(cls, params: Mapping[str, object] | None) -> "EncoderReuse | None":
        ours = params.get("vlmcache") if isinstance(params, Mapping) else None
        if not isinstance(ours, Mapping):
            return None

        def num(name: str) -> int:
            value = ours.get(name, 0)
            return int(value) if isinstance(value, (int, float)) else 0

        return cls(num("encoder_items"), num("encoder_loaded"), num("encoder_computed"))


@dataclass(frozen=True)
class ReuseReport:
    """Per-request audit of cache reuse.

    Attributes:
        request_id: vLLM's request id.
        hit_tier: the tier that decided the request (``"text:exact"``, ``"kv"``) or ``None``.
        statuses: ``hit``/``miss``/``skip`` per tier, in cascade order.
        similarity: the match score of the deciding tier (1.0 for exact), if any.
        canonical_prompt: the cached prompt text the request was rewritten to, if any.
        prompt_tokens: tokens in the prompt as sent to vLLM.
        tokens_loaded: prompt tokens whose KV came from the vlmcache store.
        tokens_from_prefix_cache: prompt tokens vLLM's own prefix cache supplied.
        tokens_computed: prompt tokens computed by the model.
        blocks_saved: KV blocks this request added to the store.
        load_failed_blocks: blocks that failed to load (corrupt/evicted) and were recomputed.
        images_encoded: media items (images, videos) that went through the vision encoder.
        images_loaded: media items whose encoder output came from the store (L1.5).
        canonical_question: the cached question a paraphrase was rewritten to (L1).
        canonical_images: content hashes of the canonical images sent instead of the
            request's own (L2 vision); empty when the images were sent as they were.
        image_similarity: the score of each canonical image's match.
        gate_refused: similarity hits the paraphrase gate refused, with the reason.
        videos: the identity each video was sent under (BLAKE3 of its sampled frames and
            their metadata; a verified near-duplicate's canonical clip's).
        video_frames: frames the model's sampling took from each video.
        video_encoder_mixes_frames: whether the model's vision encoder mixes a video's
            frames (Qwen2-VL: yes; LLaVA-NeXT-Video: no; ``None``: not known or no video).
            Videos are reused per clip either way (vLLM encodes a video as one item); where
            frames are encoded apart, a stream sent as images reuses each frame.
        canonical_tier: on a response-tier hit found under the canonical request's key
            (``response_after_canonical``), the cascade tier whose canonicalization led
            there (``text:exact``, ``embedding:vision``, ...); else ``None``.
        latency_s: request latency (engine queue to last token).
        ttft_s: time to first token, where vLLM reports it.
    """

    request_id: str
    hit_tier: str | None
    statuses: Mapping[str, TierStatus]
    similarity: float | None
    canonical_prompt: str | None
    prompt_tokens: int
    tokens_loaded: int
    tokens_from_prefix_cache: int
    tokens_computed: int
    blocks_saved: int
    load_failed_blocks: int
    latency_s: float
    images_encoded: int = 0
    images_loaded: int = 0
    canonical_question: str | None = None
    canonical_images: tuple[str, ...] = ()
    image_similarity: tuple[float, ...] = ()
    gate_refused: tuple[str, ...] = ()
    ttft_s: float | None = None
    row_keys: KVRowKeys = field(default_factory=KVRowKeys, repr=False)
    kv_cost_choice: str | None = None  # issue 11: the persistent KV tier's load/skip choice
    kv_cost_reason: str | None = None  # issue 11: predicted load vs recompute times
    videos: tuple[str, ...] = ()  # issue 34
    video_frames: tuple[int, ...] = ()
    video_encoder_mixes_frames: bool | None = None
    canonical_tier: str | None = None  # issue 35: canonical answers

    @property
    def hit(self) -> bool:
        return self.hit_tier is not None

    @property
    def chunk_keys(self) -> tuple[str, ...]:
        """Store keys of the prompt's full KV chunks (what the persistent tier holds or
        will hold for this request), in prompt order."""
        return self.row_keys.store_keys

    def log_line(self) -> str:
        """The seeds' line: ``[id] hit (text:exact) | latency=0.032s | exact_text=hit, ...``."""
        head = f"hit ({self.hit_tier})" if self.hit_tier else "miss"
        ordered = [n for n in (RESPONSE_TIER, *STATUS_ORDER) if n in self.statuses]
        ordered += [n for n in self.statuses if n not in ordered]
        statuses = ", ".join(f"{n}={self.statuses[n]}" for n in ordered)
        score = f" score={self.similarity:.3f}" if self.similarity is not None else ""
        return (f"[{self.request_id}] {head}{score} | latency={self.latency_s:.3f}s | "
                f"{statuses} | tokens loaded={self.tokens_loaded} prefix_cache="
                f"{self.tokens_from_prefix_cache} computed={self.tokens_computed}"
                f"/{self.prompt_tokens}")

    def to_dict(self) -> dict[str, object]:
        return {"request_id": self.request_id, "hit_tier": self.hit_tier,
                "statuses": dict(self.statuses), "similarity": self.similarity,
                "canonical_prompt": self.canonical_prompt,
                "prompt_tokens": self.prompt_tokens, "tokens_loaded": self.tokens_loaded,
                "tokens_from_prefix_cache": self.tokens_from_prefix_cache,
                "tokens_computed": self.tokens_computed, "blocks_saved": self.blocks_saved,
                "load_failed_blocks": self.load_failed_blocks,
                "images_encoded": self.images_encoded, "images_loaded": self.images_loaded,
                "canonical_question": self.canonical_question,
                "canonical_images": list(self.canonical_images),
                "image_similarity": list(self.image_similarity),
                "gate_refused": list(self.gate_refused),
                "latency_s": self.latency_s, "ttft_s": self.ttft_s,
                "kv_cost_choice": self.kv_cost_choice, "kv_cost_reason": self.kv_cost_reason,
                "videos": list(self.videos), "video_frames": list(self.video_frames),
                "video_encoder_mixes_frames": self.video_encoder_mixes_frames,
                "canonical_tier": self.canonical_tier}


def build_report(request_id: str, res: Resolution | None, kv: KVReuse | None,
                 enc: EncoderReuse | None, *, prompt_tokens: int, cached_tokens: int,
                 latency_s: float, ttft_s: float | None = None,
                 enabled: bool = True) -> ReuseReport:
    """The ReuseReport of one engine-served request (``CachedLLM`` and the serving front).

    ``cached_tokens``: prompt tokens vLLM did not compute (its prefix cache plus what the
    connector loaded); ``res`` is ``None`` for a request the cascade did not see.
    """
    kv = kv or KVReuse()
    statuses: dict[str, TierStatus] = dict(res.statuses) if res is not None else {}
    statuses["fusion"] = enc.status if enabled and enc is not None else "skip"
    if not enabled or kv.bypass:
        statuses["kv_cache"] = "skip"
    else:
        statuses["kv_cache"] = "hit" if kv.tokens_loaded > 0 else "miss"
    decided = res.hit_tier if res is not None else None
    hit_tier = decided or ("kv" if statuses["kv_cache"] == "hit" else None)
    l0 = max(cached_tokens - kv.tokens_loaded, 0)
    rw = res.rewrite if res is not None else None
    canonical = res is not None and res.images is not None and rw is not None
    return ReuseReport(
        request_id=request_id, hit_tier=hit_tier, statuses=statuses,
        similarity=res.similarity if res is not None else None,
        canonical_prompt=res.matched.canonical_prompt if res is not None and res.matched
        else None,
        prompt_tokens=prompt_tokens, tokens_loaded=kv.tokens_loaded,
        tokens_from_prefix_cache=l0,
        tokens_computed=max(prompt_tokens - kv.tokens_loaded - l0, 0),
        blocks_saved=kv.blocks_saved, load_failed_blocks=kv.load_failed_blocks,
        images_encoded=enc.computed if enc else 0, images_loaded=enc.loaded if enc else 0,
        latency_s=latency_s, ttft_s=ttft_s, row_keys=kv.row_keys,
        kv_cost_choice=kv.cost_model_choice, kv_cost_reason=kv.cost_model_reason,
        canonical_question=rw.canonical_question if rw else None,
        canonical_images=rw.canonical_images if canonical and rw else (),
        image_similarity=rw.image_scores if canonical and rw else (),
        gate_refused=rw.refused if rw else ())
