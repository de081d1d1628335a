"""The engine's own view of a phase, from vLLM's Prometheus ``/metrics``: mean time to
first token, queue time and prefill time of the requests the engine served, as the
difference of each histogram's ``_sum`` and ``_count`` before and after the phase, and its
median from the buckets' counts (``*_p50_ms``, interpolated within the bucket: a mean is
moved by one request whose timestamps vLLM lost, as seen on ours' prefill means, a median
is not). Beside the client's TTFT this splits ours' excess into the engine's part and the
part before it (the proxy and the front)."""

from __future__ import annotations

from typing import Any

HISTOGRAMS = {"ttft": "vllm:time_to_first_token_seconds",
              "queue": "vllm:request_queue_time_seconds",
              "prefill": "vllm:request_prefill_time_seconds"}
#: vlmcache's own counters read per phase, by their ``outcome`` label (absent on plain vLLM)
COUNTERS = {"video_handoff": "vlmcache_video_handoff_total"}


def parse_sums(text: str) -> dict[str, float]:
    """``{name_sum: total, name_count: total}`` over every label set of ``HISTOGRAMS``."""
    from prometheus_client.parser import text_string_to_metric_families

    wanted = {f"{m}{suffix}" for m in HISTOGRAMS.values() for suffix in ("_sum", "_count")}
    buckets = {f"{m}_bucket" for m in HISTOGRAMS.values()}
    counters = set(COUNTERS.values())
    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if name in counters:  # one entry per outcome: name{outcome}
                name = f"{name}{{{sample.labels.get('outcome', '')}}}"
            elif name in buckets:  # one entry per upper bound: name{le}
                name = f"{name}{{{float(sample.labels.get('le', 'inf'))!r}}}"
            elif name not in wanted:
                continue
            out[name] = out.get(name, 0.0) + float(sample.value)
    return out


def scrape(url: str) -> dict[str, float] | None:
    """The engine's histogram sums now, or ``None`` if ``/metrics`` does not answer."""
    import httpx

    try:
        r = httpx.get(url.rstrip("/") + "/metrics", timeout=5)
        r.raise_for_status()
    except httpx.HTTPError:
        return None
    return parse_sums(r.text)


def phase_means(before: dict[str, float] | None,
                after: dict[str, float] | None) -> dict[str, Any] | None:
    """Per histogram the mean over the phase's engine requests (ms) and their count."""
    if before is None or after is None:
        return None
    out: dict[str, Any] = {}
    for key, metric in HISTOGRAMS.items():
        n = after.get(metric + "_count", 0.0) - before.get(metric + "_count", 0.0)
        total = after.get(metric + "_sum", 0.0) - before.get(metric + "_sum", 0.0)
        out[f"{key}_mean_ms"] = round(total / n * 1000, 2) if n > 0 else None
        out[f"{key}_p50_ms"] = _bucket_median_ms(metric, before, after, n)
    out["requests"] = int(after.get(HISTOGRAMS["ttft"] + "_count", 0.0)
                          - before.get(HISTOGRAMS["ttft"] + "_count", 0.0))
    for key, metric in COUNTERS.items():
        prefix = metric + "{"
        moved = {name[len(prefix):-1]: int(value - before.get(name, 0.0))
                 for name, value in after.items() if name.startswith(prefix)}
        if moved:
            out[key] = moved
    return out


def _bucket_median_ms(metric: str, before: dict[str, float], after: dict[str, float],
               n: float) -> float | None:
    """The phase's median from its bucket counts, interpolated linearly within the bucket
    that holds it (``None`` without requests or buckets, or in the open last bucket)."""
    prefix = metric + "_bucket{"
    cumulative = sorted((float(name[len(prefix):-1]), value - before.get(name, 0.0))
                        for name, value in after.items() if name.startswith(prefix))
    low, below = 0.0, 0.0
    for bound, count in cumulative:
        if n > 0 and count >= n / 2:
            if bound == float("inf"):
                return None
            share = (n / 2 - below) / (count - below) if count > below else 1.0
            return round((low + share * (bound - low)) * 1000, 2)
        low, below = bound, count
    return None
