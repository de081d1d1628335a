"""Prometheus metrics of the serving front (``/metrics``).

Inside vLLM's API server they live in prometheus-client's default registry, the one vLLM
serves on ``/metrics`` (with ``PROMETHEUS_MULTIPROC_DIR`` set, prometheus-client writes
them to vLLM's multiprocess directory instead); the standalone proxy serves the same
registry itself. Per tier and tenant: lookups by status (``hit``/``miss``/``skip``), gate
refusals, tokens loaded, images whose encoder output was loaded; per stage: front latency.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge, Histogram

from vlmcache.report import ReuseReport

_LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
ALL_TENANTS = "_all"


@dataclass
class FrontMetrics:
    """The front's collectors, registered once per registry."""

    lookups: Counter
    gate_refusals: Counter
    tokens: Counter
    images_loaded: Counter
    requests: Counter
    bad_requests: Counter
    stage_seconds: Histogram
    request_seconds: Histogram
    response_bytes: Gauge
    response_entries: Gauge
    kv_path: Counter
    video_frames: Counter
    record_waits_cut: Counter
    miss_overlaps: Counter
    held_media: Counter
    video_handoff: Counter
    tenant_label: bool = True

    @classmethod
    def create(cls, registry: CollectorRegistry | None = None,
               tenant_label: bool = True) -> "FrontMetrics":
        reg = REGISTRY if registry is None else registry
        return cls(
            lookups=Counter("vlmcache_tier_lookups", "Cascade lookups by tier, tenant and "
                            "status (hit/miss/skip)", ["tier", "tenant", "status"],
                            registry=reg),
            gate_refusals=Counter("vlmcache_gate_refusals", "Paraphrase hits the gate "
                                  "refused", ["tenant"], registry=reg),
            tokens=Counter("vlmcache_prompt_tokens", "Prompt tokens by source (loaded from "
                           "the store, vLLM prefix cache, computed)", ["tenant", "source"],
                           registry=reg),
            images_loaded=Counter("vlmcache_encoder_outputs_loaded", "Images whose encoder "
                                  "output came from the store", ["tenant"], registry=reg),
            requests=Counter("vlmcache_front_requests", "Requests through the front by "
                             "deciding tier", ["tenant", "hit_tier"], registry=reg),
            bad_requests=Counter("vlmcache_front_bad_requests", "Requests refused with a "
                                 "4xx, by field", ["field"], registry=reg),
            stage_seconds=Histogram("vlmcache_front_stage_seconds", "Front time per stage",
                                    ["stage"], buckets=_LATENCY_BUCKETS, registry=reg),
            request_seconds=Histogram("vlmcache_front_request_seconds", "Request time seen "
                                      "by the front, by deciding tier", ["hit_tier"],
                                      buckets=_LATENCY_BUCKETS, registry=reg),
            response_bytes=Gauge("vlmcache_response_store_bytes", "Bytes of stored responses",
                                 registry=reg, multiprocess_mode="livesum"),
            response_entries=Gauge("vlmcache_response_store_entries", "Stored responses",
                                   registry=reg, multiprocess_mode="livesum"),
            kv_path=Counter("vlmcache_kv_path", "Per-request figures the KV path reports "
                            "in kv_transfer_params.vlmcache (chunks found/loaded/stored, "
                            "tokens, ...), summed", ["tenant", "field"], registry=reg),
            video_frames=Counter("vlmcache_video_frames", "Sampled video frames of answered "
                                 "requests, by deciding tier (a response-tier hit skipped "
                                 "their encoding and prefill)", ["tenant", "hit_tier"],
                                 registry=reg),
            record_waits_cut=Counter("vlmcache_front_record_waits_cut", "Lookups that "
                                     "stopped waiting for earlier answers' records after "
                                     "record_wait_ms", registry=reg),
            miss_overlaps=Counter("vlmcache_front_miss_overlaps", "Engine calls started "
                                  "while the cascade still looked (miss_overlap_max_inflight), "
                                  "by outcome: kept as the answer, or dropped (aborted) for "
                                  "the cascade's hit", ["outcome"], registry=reg),
            held_media=Counter("vlmcache_front_held_media", "Engine calls that named media "
                               "the engine holds without their data (held_media_bytes), by "
                               "outcome: elided, or resent in full after a refusal",
                               ["outcome"], registry=reg),
            video_handoff=Counter("vlmcache_video_handoff", "Clips the front decoded for "
                                  "vLLM's video loader, by outcome: kept, taken by the "
                                  "engine's loader (a copy; again for each later question "
                                  "on the clip), expired; decoded: the engine's loader "
                                  "decoded a clip itself", ["outcome"], registry=reg),
            tenant_label=tenant_label)

    def tenant(self, tenant: str | None) -> str:
        if not self.tenant_label:
            return ALL_TENANTS
        if tenant is None:
            return ""
        # a client's string: printable in /metrics (lone surrogates escaped), bounded
        return tenant.encode("utf-8", "backslashreplace").decode("utf-8")[:128]

    def observe_report(self, report: ReuseReport, tenant: str | None) -> None:
        """Count one finished request."""
        t = self.tenant(tenant)
        for tier, status in report.statuses.items():
            self.lookups.labels(tier, t, status).inc()
        if report.gate_refused:
            self.gate_refusals.labels(t).inc(len(report.gate_refused))
        for source, n in (("loaded", report.tokens_loaded),
                          ("prefix_cache", report.tokens_from_prefix_cache),
                          ("computed", report.tokens_computed)):
            if n:
                self.tokens.labels(t, source).inc(n)
        if report.images_loaded:
            self.images_loaded.labels(t).inc(report.images_loaded)
        tier = report.hit_tier or "miss"
        self.requests.labels(t, tier).inc()
        if report.video_frames:
            self.video_frames.labels(t, tier).inc(sum(report.video_frames))
        self.request_seconds.labels(tier).observe(report.latency_s)

    def observe_stages(self, stages: Mapping[str, float]) -> None:
        for stage, seconds in stages.items():
            self.stage_seconds.labels(stage).observe(seconds)

    def observe_kv_path(self, params: object, tenant: str | None) -> None:
        """Sum every integer the KV path put in ``kv_transfer_params["vlmcache"]``."""
        ours = params.get("vlmcache") if isinstance(params, Mapping) else None
        if not isinstance(ours, Mapping):
            return
        t = self.tenant(tenant)
        for name, value in ours.items():
            if isinstance(value, int) and not isinstance(value, bool) and value > 0:
                self.kv_path.labels(t, str(name)).inc(value)
