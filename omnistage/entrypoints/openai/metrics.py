"""HTTP-side Prometheus metrics, in the app's own registry (never prometheus_client's global).

The server owns one `CollectorRegistry`. It holds the HTTP metrics below and is handed
to the engine client, whose orchestrator adds its per-stage histograms (queue, run and
first-output times, tokens, steps) and batch sizes to it; `GET /metrics` renders all of
it.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, float("inf"))


class ServerMetrics:
    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.requests = Counter(
            "omnistage_http_requests", "HTTP requests answered, by route and status.",
            ["route", "method", "status"], registry=self.registry)
        self.latency = Histogram(
            "omnistage_http_request_duration_seconds", "From the request to the last byte of the answer.",
            ["route", "method"], buckets=_LATENCY_BUCKETS, registry=self.registry)
        self.queue_depth = Gauge(
            "omnistage_queue_depth", "Requests admitted to the engine and not finished (queued or running).",
            registry=self.registry)
        self.rejected = Counter(
            "omnistage_requests_rejected", "Requests refused before the engine, by reason.",
            ["reason"], registry=self.registry)

    def observe_http(self, route: str, method: str, status: int, seconds: float) -> None:
        self.requests.labels(route, method, str(status)).inc()
        self.latency.labels(route, method).observe(seconds)
