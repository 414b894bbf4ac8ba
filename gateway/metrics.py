"""Prometheus metrics of one gateway worker: requests, latency, channels, breakers, queues, degradation."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.priority import PriorityPools
from gateway.router import Router
from quota import QuotaService

BREAKER_VALUE = {"closed": 0, "half_open": 1, "open": 2}


class _LiveState(Collector):
    """Reads in-flight counts, breaker states, queue depths and degradation at scrape time."""

    def __init__(self, router: Router, pools: PriorityPools, quota: QuotaService):
        self._router, self._pools, self._quota = router, pools, quota

    def collect(self) -> Iterator[GaugeMetricFamily]:
        in_flight = GaugeMetricFamily("tidegate_channel_in_flight", "Requests in flight", labels=["channel"])
        healthy = GaugeMetricFamily("tidegate_channel_healthy", "1 when /health answers", labels=["channel"])
        breaker = GaugeMetricFamily("tidegate_breaker_state", "0 closed, 1 half-open, 2 open",
                                    labels=["channel", "model"])
        for channel in self._router.channels:
            in_flight.add_metric([channel.name], channel.in_flight)
            healthy.add_metric([channel.name], float(channel.healthy))
            for model in channel.config.models:
                breaker.add_metric([channel.name, model], BREAKER_VALUE[channel.breaker(model).state.value])
        active = GaugeMetricFamily("tidegate_priority_active", "Slots in use", labels=["class"])
        queued = GaugeMetricFamily("tidegate_priority_queued", "Requests waiting", labels=["class"])
        for name, pool in self._pools.pools.items():
            active.add_metric([name], pool.active)
            queued.add_metric([name], pool.queued)
        degraded = GaugeMetricFamily("tidegate_store_degraded", "1 while a Redis-down policy applies")
        degraded.add_metric([], float(self._quota.degraded))
        yield from (in_flight, healthy, breaker, active, queued, degraded)


class GatewayMetrics:
    def __init__(self, router: Router, pools: PriorityPools, quota: QuotaService):
        self.registry = CollectorRegistry()
        self.requests = Counter("tidegate_requests", "Requests by route, status and outcome",
                                ["path", "status", "outcome"], registry=self.registry)
        self.duration = Histogram("tidegate_request_seconds", "Time from request to its end", ["path"],
                                  registry=self.registry)
        self.registry.register(_LiveState(router, pools, quota))

    def observe(self, path: str, status: int, outcome: str, seconds: float) -> None:
        self.requests.labels(path, str(status), outcome).inc()
        self.duration.labels(path).observe(seconds)

    def render(self) -> bytes:
        return generate_latest(self.registry)
