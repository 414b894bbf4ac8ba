"""Prometheus metrics of one gateway worker: requests, latency, channels, breakers, queues, degradation."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Generic, TypeVar

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from gateway.observe.mcp_metrics import McpMetrics
from gateway.observe.spend_metrics import SpendMetrics

BREAKER_VALUE = {"closed": 0, "half_open": 1, "open": 2}

M = TypeVar("M", Counter, Histogram)


class Series(Generic[M]):
    """A labelled metric's series, found by their label values in a dict: prometheus_client's `labels` checks,
    converts and takes a lock on every call, several times per request. The values are strings already."""

    __slots__ = ("_metric", "_series")
    _metric: M
    _series: dict[tuple[str, ...], M]

    def __init__(self, metric: M) -> None:
        self._metric = metric
        self._series: dict[tuple[str, ...], M] = {}

    def __call__(self, *values: str) -> M:
        series = self._series.get(values)
        if series is None:
            series = self._series[values] = self._metric.labels(*values)
        return series


@dataclass(slots=True)
class ChannelLive:
    name: str
    in_flight: int
    healthy: bool
    breakers: dict[str, str]  # model -> its breaker's state


@dataclass(slots=True)
class LiveState:
    """What a scrape reads of the running gateway; the app builds it, so the metrics import none of its parts."""

    channels: list[ChannelLive]
    pools: dict[str, tuple[int, int]]  # priority class -> (slots in use, requests waiting)
    degraded: bool
    connections_open: int
    connections_closed: dict[str, int]  # reason -> connections the guard closed
    affinity_overrides: dict[str, int]  # preferred channel -> requests sent elsewhere


class _LiveState(Collector):
    """Reads in-flight counts, breaker states, queue depths and degradation at scrape time."""

    def __init__(self, read: Callable[[], LiveState]):
        self._read = read

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        live = self._read()
        in_flight = GaugeMetricFamily("tidegate_channel_in_flight", "Requests in flight", labels=["channel"])
        healthy = GaugeMetricFamily("tidegate_channel_healthy", "1 when /health answers", labels=["channel"])
        breaker = GaugeMetricFamily("tidegate_breaker_state", "0 closed, 1 half-open, 2 open",
                                    labels=["channel", "model"])
        for channel in live.channels:
            in_flight.add_metric([channel.name], channel.in_flight)
            healthy.add_metric([channel.name], float(channel.healthy))
            for model, state in channel.breakers.items():
                breaker.add_metric([channel.name, model], BREAKER_VALUE[state])
        active = GaugeMetricFamily("tidegate_priority_active", "Slots in use", labels=["class"])
        queued = GaugeMetricFamily("tidegate_priority_queued", "Requests waiting", labels=["class"])
        for name, (slots, waiting) in live.pools.items():
            active.add_metric([name], slots)
            queued.add_metric([name], waiting)
        degraded = GaugeMetricFamily("tidegate_store_degraded", "1 while a Redis-down policy applies")
        degraded.add_metric([], float(live.degraded))
        open_connections = GaugeMetricFamily("tidegate_connections_open", "Client connections open")
        open_connections.add_metric([], live.connections_open)
        closed = CounterMetricFamily("tidegate_connections_closed_by_guard", "Connections the server closed "
                                     "before a request reached the app, by reason", labels=["reason"])
        for reason, count in sorted(live.connections_closed.items()):
            closed.add_metric([reason], count)
        overrides = CounterMetricFamily("tidegate_affinity_overrides", "prefix_affinity requests sent elsewhere "
                                        "because the preferred channel was above the load bound, by that channel",
                                        labels=["channel", "reason"])
        for name, count in sorted(live.affinity_overrides.items()):
            overrides.add_metric([name, "load"], count)
        yield from (in_flight, healthy, breaker, active, queued, degraded, open_connections, closed, overrides)


LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class GatewayMetrics:
    """Label sets stay bounded: routes, statuses, channels, configured models (`other` for any other name),
    classes and tenants (unless switched off), never a value the client chose."""

    def __init__(self, serves: Callable[[str], bool], live: Callable[[], LiveState], per_account: bool = True):
        self._serves = serves
        self._per_account = per_account
        self.registry = reg = CollectorRegistry()
        self.requests = Counter("tidegate_requests", "Requests by route, model, channel, status and outcome",
                                ["path", "model", "channel", "status", "outcome"], registry=reg)
        self.duration = Histogram("tidegate_request_seconds", "Time from request to its end", ["path"],
                                  buckets=LATENCY_BUCKETS, registry=reg)
        self.refusals = Counter("tidegate_refusals", "Admissions refused, by level and limit",
                                ["level", "limit"], registry=reg)
        self.queue_wait = Histogram("tidegate_queue_wait_seconds", "Wait for a priority-class slot", ["class"],
                                    buckets=LATENCY_BUCKETS, registry=reg)
        self.upstream_ttft = Histogram("tidegate_upstream_ttft_seconds",
                                       "From the first upstream attempt to the first content token (or the "
                                       "whole answer when not streamed)", ["channel", "model"],
                                       buckets=LATENCY_BUCKETS, registry=reg)
        self.upstream_latency = Histogram("tidegate_upstream_seconds", "From the first upstream attempt to the "
                                          "end of the answer", ["channel", "model"], buckets=LATENCY_BUCKETS,
                                          registry=reg)
        self.tokens = Counter("tidegate_tokens", "Tokens settled, by account, sub-account and kind",
                              ["account", "sub_account", "kind"], registry=reg)
        self.prompt_tokens = Counter("tidegate_channel_prompt_tokens", "Prompt tokens settled, by channel and "
                                     "whether the channel served them from its prefix cache",
                                     ["channel", "cache"], registry=reg)
        self.spend = SpendMetrics(reg, self.model_label, per_account)
        self.mcp = McpMetrics(reg)
        self.requests_of, self.duration_of = Series(self.requests), Series(self.duration)
        self.queue_wait_of = Series(self.queue_wait)
        self.upstream_ttft_of, self.upstream_latency_of = Series(self.upstream_ttft), Series(self.upstream_latency)
        self._tokens, self._prompt_tokens = Series(self.tokens), Series(self.prompt_tokens)
        self.registry.register(_LiveState(live))

    def observe(self, path: str, model: str | None, channel: str | None, status: int, outcome: str,
                seconds: float) -> None:
        self.requests_of(path, self.model_label(model), channel or "", str(status), outcome).inc()
        self.duration_of(path).observe(seconds)

    def model_label(self, model: str | None) -> str:
        """A model the gateway serves by its name, any other by `other`: clients cannot mint series."""
        if not model:
            return ""
        return model if self._serves(model) else "other"

    def refused(self, level: str | None, limit: str | None) -> None:
        self.refusals.labels(level or "store", limit or "unavailable").inc()

    def settled(self, account: str, sub_account: str | None, prompt_tokens: int, completion_tokens: int) -> None:
        if not self._per_account:
            account, sub_account = "all", None
        if prompt_tokens:
            self._tokens(account, sub_account or "", "prompt").inc(prompt_tokens)
        if completion_tokens:
            self._tokens(account, sub_account or "", "completion").inc(completion_tokens)

    def prompt_cache(self, channel: str | None, prompt_tokens: int, cached_tokens: int) -> None:
        if channel and prompt_tokens:
            cached = min(cached_tokens, prompt_tokens)
            self._prompt_tokens(channel, "hit").inc(cached)
            self._prompt_tokens(channel, "miss").inc(prompt_tokens - cached)

    def render(self) -> bytes:
        return generate_latest(self.registry)
