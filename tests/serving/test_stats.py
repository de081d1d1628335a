import httpx
from prometheus_client import CollectorRegistry, generate_latest

from vlmcache.report import ReuseReport
from vlmcache.serving.metrics import FrontMetrics
from vlmcache.serving.stats import server_metrics


def test_server_metrics_sums_vlmcache_samples(monkeypatch):
    reg = CollectorRegistry()
    metrics = FrontMetrics.create(reg)
    report = ReuseReport("r", "response", {"response": "hit"}, 1.0, None, 10, 0, 0, 0, 0, 0,
                         0.001)
    for tenant in ("a", "b"):
        metrics.observe_report(report, tenant)
    text = generate_latest(reg).decode()
    monkeypatch.setattr(httpx, "get", lambda url, timeout: httpx.Response(200, text=text))
    sums = server_metrics("http://server")
    assert sums["vlmcache_tier_lookups_total"] == 2
    assert sums["vlmcache_front_requests_total"] == 2
    assert not any(k.endswith("_bucket") for k in sums)
