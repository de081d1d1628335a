"""The cascade front: one place where every tier runs on an OpenAI request.

:meth:`CascadeFront.begin` decodes the request, asks the response tier, runs the cascade
(exact, image, paraphrase) and rewrites the body; :meth:`CascadeFront.finish` reads what
the engine answered, records it for later requests (exact and similarity records, the
response tier) and builds the :class:`~vlmcache.report.ReuseReport`. No HTTP here: the
ASGI middleware (inside vLLM's server) and the standalone proxy both call this class.
"""

from __future__ import annotations

import dataclasses
import logging
import secrets
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Mapping

import vlmcache.cpu_share as cpu_share
from vlmcache.cascade import RESPONSE_TIER, Cascade, CascadeRequest, Resolution, build_cascade
from vlmcache.config import VlmCacheConfig
from vlmcache.errors import RequestError
from vlmcache.report import EncoderReuse, KVReuse, ReuseReport, build_report
from vlmcache.serving.metrics import FrontMetrics
from vlmcache.serving.openai_req import Endpoint, ParsedRequest, load_body, parse_request
from vlmcache.serving.plan import FrontPlan, cached_report, error_field, report_body
from vlmcache.serving.rewrite import forward_identity, rewrite_body
from vlmcache.tiers.response import (LocalRecordStore, RecordStore, ResponseTier,
                                     canonical_request, is_deterministic)
from vlmcache.vllm.video_io import VideoSampling

logger = logging.getLogger(__name__)

STORABLE_FINISH = ("stop", "length")
#: Response fields a stored response does not keep (per-request, or ours).
_UNSTORED = ("vlmcache", "kv_transfer_params", "ec_transfer_params", "prompt_token_ids",
             "metrics")


class CascadeFront:
    """The response tier and the cascade in front of an engine, for one namespace.

    Args:
        config: the deployment's vlmcache config.
        cascade: exact / image / paraphrase tiers (``build_cascade``).
        responses: the response tier, or ``None`` when it is off.
        metrics: Prometheus collectors, or ``None`` for none.
    """

    def __init__(self, config: VlmCacheConfig, cascade: Cascade,
                 responses: ResponseTier | None, metrics: FrontMetrics | None,
                 sampling: VideoSampling | None = None) -> None:
        self.config = config
        self.sampling = sampling or VideoSampling()
        self.mixes_frames: bool | None = None  # the model's video encoder (reports)
        self.cascade = cascade
        self.responses = responses
        self.metrics = metrics
        self._lock = threading.Lock()  # the similarity indexes are not thread-safe
        self._recorder = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vlmcache-record",
                                            initializer=cpu_share.thread_initializer())

    @classmethod
    def for_model(cls, model: str, config: VlmCacheConfig, *, metrics: FrontMetrics | None,
                  record_store: RecordStore | None = None,
                  media_io_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
                  own_process: bool = False) -> "CascadeFront":
        """The front for ``model`` (a local directory) under ``config``; ``media_io_kwargs``
        are the server's ``--media-io-kwargs`` (how its engine samples videos).
        ``own_process``: the process is the front's alone (a ``vlmcache proxy`` worker), so
        its helper threads may also run at ``front_thread_nice``; inside vLLM's API server
        they never do (a deprioritized thread holding the GIL would stall vLLM's own loop)."""
        from vlmcache.vllm.video_io import encoder_mixes_frames, video_processor_name

        from vlmcache.tenant_secret import with_deployment_salt
        from vlmcache.vllm.namespace import namespace_for_model

        config = with_deployment_salt(config)  # rewrites derive tenant salts from it
        cpu_share.configure(cpu_share.plan(
            config.engine_cpus, config.front_thread_nice if own_process else 0))
        digest = namespace_for_model(model, config).digest
        responses = None
        if config.enable_response_cache:
            from vlmcache.shared.responses import shared_record_store  # issue 14B

            store = record_store or shared_record_store(  # issue 14B: Redis behind, if set
                config, LocalRecordStore(config.response_memory_budget))
            responses = ResponseTier(store, digest, config.response_ttl_s,
                                     config.response_max_entry_bytes)
        logger.info("vlmcache front: model %s, namespace %s, store %s, tiers on: %s",
                    model, digest[:16], config.store_dir, ", ".join(_tiers_on(config)))
        sampling = VideoSampling(dict(media_io_kwargs or {}), video_processor_name(model))
        front = cls(config, build_cascade(config, digest), responses, metrics, sampling)
        front.mixes_frames = encoder_mixes_frames(model)
        warm_up(front.cascade)
        return front

    # ---- before the engine ---------------------------------------------------------------

    def begin(self, endpoint: Endpoint, raw: bytes, headers: Mapping[str, str]) -> FrontPlan:
        """Decode, look up and rewrite one request; :class:`RequestError` if it is bad."""
        plan = self.prepare(endpoint, raw, headers)
        if plan.cached is None:
            self.resolve(plan)
        return plan

    def prepare(self, endpoint: Endpoint, raw: bytes, headers: Mapping[str, str],
                overlap: bool = False) -> FrontPlan:
        """Decode the request and ask the response tier (:class:`RequestError` if it is
        bad). With ``overlap``, where the cascade still has similarity lookups to run for
        it, also the body the engine gets if they find nothing (``plan.miss_forward``):
        the caller may start the engine on it while :meth:`resolve` runs."""
        started = time.perf_counter()
        req = parse_request(endpoint, load_body(raw), headers, self.config, self.sampling)
        t_decoded = time.perf_counter()
        plan = FrontPlan(req, None, None, "skip", None, None, started,
                         {"decode": t_decoded - started})
        self._lookup_response(plan)
        t_response = time.perf_counter()
        plan.stages["response_lookup"] = t_response - t_decoded
        # not with videos: a dropped call's clip would still be processed by vLLM's server
        # (its frames, before the engine sees it), holding the loop longer than the hidden
        # lookups take
        if overlap and plan.cached is None and not req.options.bypass and not req.videos \
                and req.transcript is not None \
                and self.cascade.has_similarity_lookups(bool(req.images)):
            plan.miss_forward = rewrite_body(req, None, self.config)
            plan.stages["miss_body"] = time.perf_counter() - t_response
        return plan

    def resolve(self, plan: FrontPlan) -> None:
        """Run the cascade on a prepared request and write the body to forward
        (``plan.forward``); after a rewrite, ask the response tier for the canonical
        request's answer (``plan.cached``)."""
        req = plan.request
        t_response = t_start = time.perf_counter()
        if not req.options.bypass and req.transcript is not None:
            # read your writes: answers already sent are findable, within a bound
            if not self.drain(self.config.record_wait_ms / 1000.0) and self.metrics is not None:
                self.metrics.record_waits_cut.inc()
            t_response = time.perf_counter()
            plan.stages["wait_records"] = t_response - t_start
            plan.resolution = self._resolve(req)
        t_cascade = time.perf_counter()
        plan.forward = rewrite_body(req, plan.resolution, self.config)
        t_rewrite = time.perf_counter()
        plan.stages["cascade"] = t_cascade - t_response
        plan.stages["rewrite"] = t_rewrite - t_cascade
        if self.config.response_after_canonical:
            self._lookup_canonical(plan)
            plan.stages["canonical_lookup"] = time.perf_counter() - t_rewrite

    def keep_overlap(self, plan: FrontPlan) -> bool:
        """Whether the engine call started on ``plan.miss_forward`` is the answer: the
        cascade found nothing to answer from and forwards exactly that body. Otherwise
        the call is dropped (the caller aborts it) and the cascade's choice goes ahead."""
        kept = plan.cached is None and plan.forward == plan.miss_forward
        plan.overlap = "kept" if kept else "dropped"
        if self.metrics is not None:
            self.metrics.miss_overlaps.labels(plan.overlap).inc()
        return kept

    def _resolve(self, req: ParsedRequest) -> Resolution | None:
        """The cascade's resolution; a fault in a tier is a miss and a log line."""
        assert req.transcript is not None
        try:
            with self._lock:
                return self.cascade.resolve(
                    req.transcript, req.image_hashes, req.tenant,
                    images=[ref.image for ref in req.images], question=req.question,
                    video_hashes=req.video_hashes,
                    videos=[ref.query for ref in req.videos])
        except Exception:
            logger.exception("front: cascade lookup failed; the request goes on as a miss")
            return None

    def _lookup_response(self, plan: FrontPlan) -> None:
        req = plan.request
        if self.responses is None or req.options.bypass or not req.options.response_cache \
                or not is_deterministic(req.body):
            return
        key = self.responses.key(canonical_request(req.endpoint, req.identity_body()),
                                 req.tenant)
        plan.response_key = key
        plan.cached = self.responses.lookup(key)
        plan.response_status = "hit" if plan.cached is not None else "miss"

    def _lookup_canonical(self, plan: FrontPlan) -> None:
        """After a rewrite, ask the response tier for the canonical request's answer.

        The key is the identity of the body the engine would get: the engine's answer to it
        is by definition what a stored answer under that key holds. Only where the as-sent
        lookup ran (deterministic sampling, not bypassed or opted out) and the key differs
        from the as-sent one (an unchanged request already missed under it).
        """
        req, res = plan.request, plan.resolution
        if self.responses is None or plan.response_key is None or res is None \
                or plan.forward is None or not _canonicalized(req, res):
            return
        key = self.responses.key(canonical_request(
            req.endpoint, forward_identity(req, res, plan.forward)), req.tenant)
        if key == plan.response_key:
            return
        plan.canonical_key = key
        plan.cached = self.responses.lookup(key)
        if plan.cached is not None:
            plan.response_status = "hit"

    # ---- answers ---------------------------------------------------------------------------

    def cached_response(self, plan: FrontPlan) -> dict[str, Any]:
        """The stored response for a response-tier hit, with a new id and its report."""
        assert plan.cached is not None
        body = dict(plan.cached)
        prefix = "chatcmpl" if plan.request.endpoint == "chat" else "cmpl"
        body["id"] = f"{prefix}-vlmc-{secrets.token_hex(12)}"
        body["created"] = int(time.time())
        report = dataclasses.replace(cached_report(plan, body),
                                     video_encoder_mixes_frames=self._mixes(plan))
        if plan.canonical_key is not None and plan.resolution is not None:
            # as the engine path would: the request's images and question become findable
            self._recorder.submit(self._remember_logged, plan.request, plan.resolution, report)
        self._observe(plan, report)
        body["vlmcache"] = report_body(plan, report)
        return body

    def finish(self, plan: FrontPlan, status: int,
               body: dict[str, Any] | None) -> ReuseReport | None:
        """Record an engine's answer; the report (``None`` for an error answer).

        The response tier records at once (a repeat right after must find it); the exact
        and similarity records are made by one background thread, in arrival order, so
        that embedding and index work never delays the answer.
        """
        t0 = time.perf_counter()
        if status != 200 or not isinstance(body, dict) or not body.get("choices"):
            return None
        report = self._engine_report(plan, body)
        req, res = plan.request, plan.resolution
        if plan.response_key is not None and self.responses is not None \
                and all(c.get("finish_reason") in STORABLE_FINISH for c in body["choices"]):
            stored = {k: v for k, v in body.items() if k not in _UNSTORED}
            self.responses.record(plan.response_key, stored)
            if plan.canonical_key is not None:  # the engine ran the canonical request
                self.responses.record(plan.canonical_key, stored)
        if res is not None:
            self._recorder.submit(self._remember_logged, req, res, report)
        plan.stages["capture"] = time.perf_counter() - t0
        self._observe(plan, report)
        if self.metrics is not None:
            self.metrics.observe_kv_path(body.get("kv_transfer_params"), req.tenant)
            if plan.held_media is not None:
                self.metrics.held_media.labels(plan.held_media).inc()
        return report

    def settle(self, plan: FrontPlan) -> None:
        """The request is answered: the clips' thumbnails a lookup did not need start in the
        background now (kept off the request's path, where they took vLLM's API-server
        GIL from its own preparation of the request)."""
        for ref in plan.request.videos:
            ref.query.thumbs.start_rest()

    def drain(self, timeout_s: float | None = None) -> bool:
        """Wait until every queued exact/similarity record is made, at most ``timeout_s``
        (``None``: as long as it takes); whether they all were."""
        try:
            self._recorder.submit(lambda: None).result(timeout=timeout_s)
        except TimeoutError:
            return False
        return True

    def _remember_logged(self, req: ParsedRequest, res: Resolution,
                         report: ReuseReport) -> None:
        t0 = time.perf_counter()
        try:
            self._remember(req, res, report)
        except Exception:  # a record that fails is a later miss, never an error
            logger.exception("front: recording request %s failed", report.request_id)
        if self.metrics is not None:
            self.metrics.stage_seconds.labels("record").observe(time.perf_counter() - t0)

    def refused(self, error: RequestError) -> None:
        """Count a request refused with a 4xx."""
        if self.metrics is not None:
            self.metrics.bad_requests.labels(error_field(error)).inc()

    def _engine_report(self, plan: FrontPlan, body: dict[str, Any]) -> ReuseReport:
        kv = KVReuse.from_params(body.get("kv_transfer_params"))
        enc = EncoderReuse.from_params(body.get("ec_transfer_params"))
        usage = body.get("usage") if isinstance(body.get("usage"), dict) else {}
        details = usage.get("prompt_tokens_details") or {}
        prompt_tokens = int(usage.get("prompt_tokens") or (kv.prompt_tokens if kv else 0))
        cached = int(details.get("cached_tokens") or 0) or (
            (kv.tokens_loaded + kv.tokens_from_prefix_cache) if kv else 0)
        report = build_report(str(body.get("id", "")), plan.resolution, kv, enc,
                              prompt_tokens=prompt_tokens, cached_tokens=cached,
                              latency_s=time.perf_counter() - plan.started,
                              enabled=not plan.request.options.bypass)
        statuses = {RESPONSE_TIER: plan.response_status, **report.statuses}
        res = plan.resolution  # canonical videos where the video tier matched
        videos = res.video_hashes if res is not None and res.video_hashes \
            else plan.request.video_hashes
        return dataclasses.replace(report, statuses=statuses, videos=videos,
                                   video_frames=plan.request.video_frames,
                                   video_encoder_mixes_frames=self._mixes(plan))

    def _mixes(self, plan: FrontPlan) -> bool | None:
        return self.mixes_frames if plan.request.videos else None

    def _remember(self, req: ParsedRequest, res: Resolution, report: ReuseReport) -> None:
        """Make this request findable: exact record and canonical images/questions."""
        assert req.transcript is not None
        for ref in req.videos:  # the background thumbnails, waited for outside the lock
            ref.query.thumbs.all()
        with self._lock:
            self.cascade.record_served(res, req.tenant, report.row_keys, report.prompt_tokens)
            self.cascade.remember(CascadeRequest(
                req.transcript, res.image_hashes, req.tenant,
                tuple(ref.image for ref in req.images), req.question, req.video_hashes,
                tuple(ref.query for ref in req.videos)), res)

    def _observe(self, plan: FrontPlan, report: ReuseReport) -> None:
        if self.metrics is not None:
            self.metrics.observe_report(report, plan.request.tenant)
            self.metrics.observe_stages(plan.stages)
            store = self.responses.store if self.responses is not None else None
            if isinstance(store, LocalRecordStore):
                self.metrics.response_bytes.set(store.occupancy_bytes)
                self.metrics.response_entries.set(len(store))
        if self.config.log_requests:
            logger.info("%s", report.log_line())

    def close(self) -> None:
        """Make the queued records, then persist the similarity indexes."""
        self._recorder.shutdown(wait=True)
        with self._lock:
            self.cascade.flush()


def _canonicalized(req: ParsedRequest, res: Resolution) -> bool:
    """Whether the cascade sends other text or other media than the request's own."""
    media = req.image_hashes + req.video_hashes
    return (req.transcript is not None and res.prompt != req.transcript) \
        or (bool(res.media_hashes) and res.media_hashes != media)


def _tiers_on(config: VlmCacheConfig) -> list[str]:
    flags = [("response", config.enable_response_cache), ("exact", config.enable_exact),
             ("image", config.enable_image_embedding),
             ("paraphrase", config.enable_semantic_text),
             ("encoder", config.enable_encoder_cache), ("kv_load", config.enable_kv_load),
             ("kv_save", config.enable_kv_save)]
    return [name for name, on in flags if on] or ["none"]


def warm_up(cascade: Cascade) -> None:
    """Load the similarity tiers' embedders before the server takes requests. They load
    lazily, so without this the first requests after a start (in each proxy worker) wait
    seconds for the weights. A failure is logged and left to the first request (a miss)."""
    started = time.perf_counter()
    try:
        if cascade.text is not None:
            cascade.text.embedder.warm_up("warm up")
        if cascade.image is not None:
            from PIL import Image

            cascade.image.embedder.warm_up(Image.new("RGB", (64, 64), (127, 127, 127)))
    except Exception as exc:  # noqa: BLE001 -- a cache fault is a miss, never a failed start
        logger.warning("vlmcache front: embedder warm-up failed (%s: %s); the first request "
                       "loads it", type(exc).__name__, exc)
        return
    if cascade.text is not None or cascade.image is not None:
        logger.info("vlmcache front: embedders loaded in %.1f s",
                    time.perf_counter() - started)
