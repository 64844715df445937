"""``GET /metrics``: the server's counters in Prometheus' text format, through prometheus-client.

Each server has its own registry (two apps in one process never share counts). Counters and
histograms are updated once per request, as its last byte is sent
(:mod:`anyformer.server._request_log`); what the pool holds (loaded models, their bytes, the queue)
is read from the pool at each scrape, so it is never stale.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.requests import Request
from starlette.responses import Response

from anyformer.server._timings import RequestRecord

if TYPE_CHECKING:
    from anyformer.server._pool import ModelPool

#: Time to first token, seconds: from a fast GPU's prompt to a long prompt on a laptop.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
#: Seconds between generated tokens: 1000 tok/s down to 1 tok/s.
TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0)


class _PoolCollector(Collector):
    """Gauges read from the pool at scrape time: models loaded, their memory, requests waiting and streaming."""

    def __init__(self, pool: ModelPool) -> None:
        self._pool = pool

    def collect(self) -> Iterator[GaugeMetricFamily]:
        loaded = self._pool.loaded()
        models = GaugeMetricFamily("anyformer_loaded_models", "Models loaded now")
        models.add_metric([], len(loaded))
        memory = GaugeMetricFamily(
            "anyformer_loaded_model_bytes",
            "Memory a loaded model takes, by the chosen backend's estimate",
            labels=["model", "backend", "memory"],
        )
        for item in loaded:
            memory.add_metric([item["id"], item["backend"], "gpu"], item["gpu_bytes"])
            memory.add_metric([item["id"], item["backend"], "ram"], item["ram_bytes"])
        queue = GaugeMetricFamily("anyformer_queue_depth", "Requests waiting for a model's slot")
        queue.add_metric([], self._pool.queued())
        active = GaugeMetricFamily("anyformer_active_streams", "Requests a model is serving now")
        active.add_metric([], sum(item["active"] for item in loaded))
        yield from (models, memory, queue, active)


class ServerMetrics:
    """The counters of one server, and the ``/metrics`` route that shows them."""

    def __init__(self, pool: ModelPool) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "anyformer_requests",
            "HTTP requests answered, by route and status",
            ["route", "status"],
            registry=self.registry,
        )
        self.errors = Counter(
            "anyformer_errors",
            "Requests refused or failed, by anyformer's error code (also errors inside a stream)",
            ["code"],
            registry=self.registry,
        )
        self.prompt_tokens = Counter(
            "anyformer_prompt_tokens",
            "Prompt tokens processed (where the backend counts them)",
            ["model", "backend"],
            registry=self.registry,
        )
        self.generated_tokens = Counter(
            "anyformer_generated_tokens", "Tokens generated", ["model", "backend"], registry=self.registry
        )
        self.ttft = Histogram(
            "anyformer_time_to_first_token_seconds",
            "Seconds from asking the backend to its first token",
            ["backend"],
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.token_gap = Histogram(
            "anyformer_inter_token_seconds",
            "Mean seconds between tokens after the first, one observation per generation",
            ["backend"],
            buckets=TOKEN_GAP_BUCKETS,
            registry=self.registry,
        )
        self.registry.register(_PoolCollector(pool))

    def observe(self, route: str, status: int, error_code: str | None, record: RequestRecord) -> None:
        """Count one answered request: its route and status, its error code, its generations' tokens and times."""
        self.requests.labels(route, str(status)).inc()
        codes = [error_code] if error_code else []
        codes += [
            clock.error_code for clock in record.generations if clock.error_code and clock.error_code != error_code
        ]
        for code in codes:
            self.errors.labels(code).inc()
        for clock in record.generations:
            if clock.prompt_tokens:
                self.prompt_tokens.labels(clock.model, clock.backend).inc(clock.prompt_tokens)
            if clock.tokens:
                self.generated_tokens.labels(clock.model, clock.backend).inc(clock.tokens)
            if clock.ttft is not None:
                self.ttft.labels(clock.backend).observe(clock.ttft)
            if clock.token_gap is not None:
                self.token_gap.labels(clock.backend).observe(clock.token_gap)

    async def endpoint(self, request: Request) -> Response:
        """``GET /metrics``: everything above in Prometheus' text format."""
        return Response(generate_latest(self.registry), headers={"Content-Type": CONTENT_TYPE_LATEST})
