"""The Python entry point: :class:`CachedLLM` wraps ``vllm.LLM`` with vlmcache's tiers.

Example::

    from vlmcache import CachedLLM, VlmCacheConfig, VlmRequest

    llm = CachedLLM("path/to/llava", VlmCacheConfig(store_path="/var/cache/vlmcache",
                                                    block_size=32))
    out = llm.generate([VlmRequest("USER: <image>\\nWhat is shown? ASSISTANT:", (image,))])
    print(out[0].text, out[0].report.log_line())

Videos are given as encoded clips (``VlmRequest(prompt, videos=(mp4_bytes,))``) and served as
the serving front serves ``video_url`` parts (:mod:`vlmcache.api_media`).
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from vlmcache.api_media import (DEFAULT_IMAGE_PLACEHOLDER, DEFAULT_VIDEO_PLACEHOLDER,
                                IMAGE_TOKEN_KEYS, VIDEO_TOKEN_KEYS, ApiVideo, VideoDecoder,
                                check_images, check_videos, model_placeholder)
from vlmcache.cascade import Cascade, CascadeRequest, Resolution, Rewrite, build_cascade
from vlmcache.config import VlmCacheConfig
from vlmcache.errors import ConfigError, RequestError
from vlmcache.keys import image_content_hash, image_uuid, tenant_cache_salt
from vlmcache.report import EncoderReuse, KVReuse, ReuseReport, build_report
from vlmcache.tenant_secret import deployment_salt
from vlmcache.vllm.engine_config import engine_wiring
from vlmcache.vllm.namespace import namespace_for_model
from vlmcache.vllm.stack_room import call_with_stack_room

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class VlmRequest:
    """One prompt with its images (PIL) and videos (encoded clips), for one tenant.

    The prompt must already be in the model's format, with one image placeholder per image
    (``<image>`` for LLaVA) and one video placeholder per video (``<video>`` for
    LLaVA-NeXT-Video). ``question`` (optional) is the part of the prompt a paraphrase tier may
    replace; without it the paraphrase tiers compare (and replace) the whole prompt.
    ``videos``: each clip's file bytes (MP4, AVI, ...), decoded as the engine samples them.
    """

    prompt: str
    images: tuple[Any, ...] = ()
    tenant: str | None = None
    question: str | None = None
    videos: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class CachedOutput:
    """vLLM's ``RequestOutput`` plus vlmcache's :class:`ReuseReport`."""

    output: Any
    report: ReuseReport
    rewrite: Rewrite | None = None  # what a similarity tier canonicalized, with scores

    @property
    def text(self) -> str:
        return self.output.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return list(self.output.outputs[0].token_ids)


DEFAULT_PLACEHOLDER = DEFAULT_IMAGE_PLACEHOLDER


def validate_request(req: VlmRequest | str, index: int,
                     placeholder: str | None = DEFAULT_PLACEHOLDER,
                     video_placeholder: str | None = DEFAULT_VIDEO_PLACEHOLDER,
                     max_videos: int = VlmCacheConfig.max_videos_per_request) -> VlmRequest:
    """A well-formed :class:`VlmRequest`, or :class:`RequestError` naming the problem.

    ``placeholder`` / ``video_placeholder``: the model's image and video placeholders; the
    prompt must hold exactly one per image and per video (``None``: not checked).
    ``max_videos``: the most videos one request may carry (``max_videos_per_request``).
    """
    if isinstance(req, str):
        req = VlmRequest(req)
    if not isinstance(req, VlmRequest):
        raise RequestError(f"request {index}: expected VlmRequest or str, "
                           f"got {type(req).__name__}")
    if not isinstance(req.prompt, str) or not req.prompt.strip():
        raise RequestError(f"request {index}: prompt must be a non-empty string")
    check_images(req.images, index)
    if req.tenant is not None and (not isinstance(req.tenant, str) or not req.tenant):
        raise RequestError(f"request {index}: tenant must be a non-empty string or None")
    if req.question is not None and (not isinstance(req.question, str)
                                     or req.question not in req.prompt):
        raise RequestError(f"request {index}: question must be a substring of the prompt")
    if placeholder is not None and req.prompt.count(placeholder) != len(req.images):
        raise RequestError(f"request {index}: prompt has {req.prompt.count(placeholder)} image "
                           f"placeholder(s) {placeholder!r} but {len(req.images)} image(s) "
                           "were given: each image needs one placeholder")
    videos = check_videos(req.videos, index, req.prompt, video_placeholder, max_videos)
    return VlmRequest(req.prompt, tuple(req.images), req.tenant, req.question, videos)


def model_image_placeholder(model: str) -> str:
    """The model's image placeholder text: the tokenizer's content of its image token id
    (``config.json``'s ``image_token_index`` / ``image_token_id``), else ``<image>``."""
    return model_placeholder(model, IMAGE_TOKEN_KEYS, DEFAULT_IMAGE_PLACEHOLDER)


def model_video_placeholder(model: str) -> str:
    """The model's video placeholder text (``video_token_index`` / ``video_token_id``),
    else ``<video>``."""
    return model_placeholder(model, VIDEO_TOKEN_KEYS, DEFAULT_VIDEO_PLACEHOLDER)


@dataclass(frozen=True)
class _Planned:
    """One request on its way to vLLM: its images' own identities, its videos as given,
    the cascade's resolution, and the videos to send (canonical where the tier matched)."""

    request: VlmRequest
    image_hashes: tuple[str, ...]
    videos: tuple[ApiVideo, ...]
    resolution: Resolution
    sent_videos: tuple[ApiVideo, ...]

    @property
    def video_hashes(self) -> tuple[str, ...]:
        return tuple(v.content_hash for v in self.videos)


class CachedLLM:
    """``vllm.LLM`` with vlmcache's persistent KV tiers attached.

    Args:
        model: a local model directory (or a hub id cached locally).
        config: a :class:`VlmCacheConfig`, a mapping of its keys, or a YAML path.
        enabled: ``False`` runs the same engine with no vlmcache at all (a baseline).
        engine_args: passed to ``vllm.LLM`` unchanged (``max_model_len``, ``seed``, ...);
            their ``media_io_kwargs`` also say how videos are sampled (as ``--media-io-kwargs``
            does for a server), also when ``engine`` is given.
        engine: an already started ``vllm.LLM`` to use instead of starting one (it must
            have been started by a ``CachedLLM`` on the same ``store_path``).
    """

    def __init__(self, model: str | Path, config: VlmCacheConfig | Mapping[str, object]
                 | str | Path | None = None, *, enabled: bool = True,
                 engine_args: Mapping[str, Any] | None = None, engine: Any = None) -> None:
        self.config = _as_config(config)
        self.enabled = enabled
        self.model = str(model)
        self.image_placeholder = model_image_placeholder(self.model)
        self.video_placeholder = model_video_placeholder(self.model)
        self._videos = VideoDecoder(self.model, self.config,
                                    (engine_args or {}).get("media_io_kwargs"))
        self._cascade = Cascade(None)
        if enabled and (self.config.enable_exact or self.config.enable_image_embedding
                        or self.config.enable_semantic_text
                        or self.config.enable_video_near_duplicates):
            ns = namespace_for_model(self.model, self.config)
            self._cascade = build_cascade(self.config, ns.digest)
        self.llm = engine if engine is not None else self._start_engine(dict(engine_args or {}))

    def _start_engine(self, args: dict[str, Any]) -> Any:
        from vllm import LLM

        if self.enabled:
            wiring = engine_wiring(self.config, _device_type())
            os.environ.update(wiring.env)  # before the engine's processes start
            args.update(wiring.llm_kwargs(block_size=False))
        if self.config.block_size is not None:
            args.setdefault("block_size", self.config.block_size)
        # the engine's step loop (in its forked EngineCore) inside one roomy stack chunk
        return call_with_stack_room(lambda: LLM(model=self.model, **args))

    def generate(self, requests: Sequence[VlmRequest | str], sampling_params: Any = None,
                 *, bypass: bool = False) -> list[CachedOutput]:
        """Generate for each request; outputs come back in order with their reports.

        ``bypass=True`` neither loads nor saves KV for these requests (a cache-off answer
        from the same engine).
        """
        from vllm import SamplingParams

        if isinstance(requests, (str, VlmRequest)):
            raise RequestError(f"requests: expected a list of requests, got one "
                               f"{type(requests).__name__} (wrap it in a list)")
        reqs = [validate_request(r, i, self.image_placeholder, self.video_placeholder,
                                 self.config.max_videos_per_request)
                for i, r in enumerate(requests)]
        if not reqs:
            return []
        plans = [self._plan(r, i, bypass) for i, r in enumerate(reqs)]
        # CachedLLM mints every medium's identity: what vLLM derives from one is scoped too
        params = [_with_transfer_params(sampling_params or SamplingParams(), bypass,
                                        p.request.tenant,
                                        bool(p.request.images or p.request.videos))
                  for p in plans]
        prompts = [self._vllm_prompt(p) for p in plans]
        start = time.perf_counter()
        outputs = self.llm.generate(prompts, params, use_tqdm=False)
        wall = time.perf_counter() - start
        results = []
        for plan, out in zip(plans, outputs):
            report = self._report(out, plan, wall)
            if self.enabled and not bypass:
                self._remember(plan, report)
            if self.config.log_requests:
                logger.info("%s", report.log_line())
            results.append(CachedOutput(out, report, plan.resolution.rewrite))
        return results

    def _plan(self, req: VlmRequest, index: int, bypass: bool) -> _Planned:
        """Name the request's media by content, decode its videos once, ask the cascade."""
        hashes = tuple(image_content_hash(im) for im in req.images)
        # the near-duplicate tier keeps a clip's bytes (as a data URL) to send it again
        keep = self.enabled and not bypass and self._cascade.video is not None
        videos = tuple(self._videos.decode(clip, f"request {index}: video {j}", keep)
                       for j, clip in enumerate(req.videos))
        res, sent = self._resolve(req, hashes, videos, bypass)
        return _Planned(req, hashes, videos, res, sent)

    def _remember(self, plan: _Planned, report: ReuseReport) -> None:
        """Record what this request computed, for the exact and similarity tiers."""
        req, res = plan.request, plan.resolution
        self._cascade.record_served(res, req.tenant, report.row_keys, report.prompt_tokens)
        self._cascade.remember(
            CascadeRequest(req.prompt, res.image_hashes, req.tenant, req.images, req.question,
                           plan.video_hashes, tuple(v.query for v in plan.videos)), res)

    def _resolve(self, req: VlmRequest, hashes: tuple[str, ...], videos: tuple[ApiVideo, ...],
                 bypass: bool) -> tuple[Resolution, tuple[ApiVideo, ...]]:
        """The cascade's resolution and the videos to send with it."""
        own = tuple(v.content_hash for v in videos)
        if not self.enabled or bypass:
            return Resolution(req.prompt, None, None, {"exact_text": "skip"},
                              image_hashes=hashes, video_hashes=own), videos
        res = self._cascade.resolve(req.prompt, hashes, req.tenant, images=req.images,
                                    question=req.question, video_hashes=own,
                                    videos=[v.query for v in videos])
        sent = self._videos.canonical(videos, res)
        if sent is None:  # a canonical clip is lost: every tier binds to the clip as sent
            res = self._cascade.resolve(req.prompt, hashes, req.tenant, images=req.images,
                                        question=req.question, video_hashes=own)
            sent = videos
        return res, sent

    def _vllm_prompt(self, plan: _Planned) -> dict[str, Any]:
        req, res = plan.request, plan.resolution
        salt = deployment_salt(self.config)
        prompt: dict[str, Any] = {"prompt": res.prompt}
        data: dict[str, Any] = {}
        uuids: dict[str, list[str]] = {}
        if req.images:
            # a near-duplicate image is sent as its canonical image: pixels and identity
            images = list(res.images if res.images is not None else req.images)
            data["image"] = images[0] if len(images) == 1 else images
            uuids["image"] = [image_uuid(salt, req.tenant, h)
                              for h in res.image_hashes or plan.image_hashes]
        if plan.sent_videos:
            # vLLM's offline form of a decoded video: (frames, metadata) per video
            data["video"] = [v.engine_item() for v in plan.sent_videos]
            uuids["video"] = [image_uuid(salt, req.tenant, v.content_hash)
                              for v in plan.sent_videos]
        if data:
            # Tenant-scoped, content-derived identities: every cache keyed by them (vLLM's
            # encoder cache, vlmcache's encoder tier, KV keys) stays per tenant.
            prompt["multi_modal_data"], prompt["multi_modal_uuids"] = data, uuids
        if req.tenant is not None:
            prompt["cache_salt"] = tenant_salt(salt, req.tenant)
        return prompt

    def _report(self, out: Any, plan: _Planned, wall: float) -> ReuseReport:
        kv = KVReuse.from_params(out.kv_transfer_params) or KVReuse()
        enc = EncoderReuse.from_params(getattr(out, "ec_transfer_params", None))
        latency, ttft = _timings(out, wall)
        report = build_report(str(out.request_id), plan.resolution, kv, enc,
                              prompt_tokens=len(out.prompt_token_ids or ()) or kv.prompt_tokens,
                              cached_tokens=out.num_cached_tokens or 0, latency_s=latency,
                              ttft_s=ttft, enabled=self.enabled)
        return dataclasses.replace(report, videos=tuple(v.content_hash for v in plan.sent_videos),
                                   video_frames=tuple(v.frame_count for v in plan.videos))

    def close(self) -> None:
        """Persist the similarity indexes and shut the engine down (the engine flushes the
        store's pending disk writes)."""
        self._cascade.flush()
        llm, self.llm = self.llm, None
        if llm is not None:
            engine = getattr(llm, "llm_engine", None)
            shutdown = getattr(engine, "shutdown", None) or getattr(
                getattr(engine, "engine_core", None), "shutdown", None)
            if callable(shutdown):
                shutdown()

    def __enter__(self) -> "CachedLLM":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tenant_salt(deployment_salt: str, tenant: str) -> str:
    """The ``cache_salt`` vLLM gets for ``tenant``: isolates vLLM's and our caches."""
    return tenant_cache_salt(deployment_salt, tenant)


def _device_type() -> str:
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def _as_config(config: VlmCacheConfig | Mapping[str, object] | str | Path | None) -> VlmCacheConfig:
    if config is None:
        return VlmCacheConfig()
    if isinstance(config, VlmCacheConfig):
        return config
    if isinstance(config, (str, Path)):
        return VlmCacheConfig.from_yaml(config)
    if isinstance(config, Mapping):
        return VlmCacheConfig.from_dict(config)
    raise ConfigError(f"config: expected a VlmCacheConfig, a mapping of its keys or a YAML "
                      f"path, got {type(config).__name__}")


def _with_transfer_params(params: Any, bypass: bool, tenant: str | None,
                          scoped_media: bool = False) -> Any:
    """A copy of ``params`` carrying vlmcache's per-request KV parameters (the KV tier
    charges stored chunks to ``tenant``; ``scoped_media``: vlmcache minted every medium's
    identity, so the encoder-output tier may store what vLLM derives from them)."""
    params = copy.deepcopy(params)
    extra = dict(params.extra_args or {})
    ours: dict[str, Any] = {"bypass": bypass}
    if tenant is not None:
        ours["tenant"] = tenant
    if scoped_media:
        ours["scoped_media"] = True
    extra["kv_transfer_params"] = {"vlmcache": ours}
    params.extra_args = extra
    return params


def _timings(out: Any, wall: float) -> tuple[float, float | None]:
    m = getattr(out, "metrics", None)
    queued = getattr(m, "queued_ts", 0.0) or 0.0
    last = getattr(m, "last_token_ts", 0.0) or 0.0
    ttft = getattr(m, "first_token_latency", None) or None
    latency = last - queued if last > queued > 0 else wall
    return latency, ttft
