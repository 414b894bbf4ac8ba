"""Prometheus metrics of one backend server, with vLLM's metric names under a `tidegate_backend_` prefix.

Each app owns its own CollectorRegistry, so several servers (or tests) in one process never share counters.
Engine state (running, waiting, KV usage, prefix cache, preemptions, speculative decoding) is read from `Engine.stats()` at scrape
time; per-request figures are recorded when a request ends.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from backend.engine.records import RequestTimings

PREFIX = "tidegate_backend_"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0,
                   7.5, 10.0, 20.0, 40.0, 80.0, 160.0)
TOKEN_GAP_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0,
                     2.5, 5.0, 10.0)


class BackendMetrics:
    """Counters and histograms per request, plus the engine's gauges read live on every scrape."""

    def __init__(self, model_name: str, stats: Callable[[], Any | None]) -> None:
        self.registry = CollectorRegistry()
        labels = ["model_name"]
        self._model = model_name
        reg = self.registry
        self.prompt_tokens = Counter(PREFIX + "prompt_tokens", "Prompt tokens processed.", labels, registry=reg)
        self.generation_tokens = Counter(PREFIX + "generation_tokens", "Tokens generated.", labels, registry=reg)
        self.request_success = Counter(PREFIX + "request_success", "Requests ended, by finish reason.",
                                       [*labels, "finished_reason"], registry=reg)
        self.rejected = Counter(PREFIX + "request_rejected", "Requests refused before they ran, by reason.",
                                [*labels, "reason"], registry=reg)
        self.ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Arrival to first token.", labels,
                              buckets=LATENCY_BUCKETS, registry=reg)
        self.itl = Histogram(PREFIX + "inter_token_latency_seconds", "Gap between consecutive tokens.", labels,
                             buckets=TOKEN_GAP_BUCKETS, registry=reg)
        self.e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "Arrival to last token.", labels,
                             buckets=LATENCY_BUCKETS, registry=reg)
        self.queue_time = Histogram(PREFIX + "request_queue_time_seconds", "Time spent waiting to start.",
                                    labels, buckets=LATENCY_BUCKETS, registry=reg)
        reg.register(_EngineCollector(model_name, stats))

    def request_finished(self, prompt_tokens: int, completion_tokens: int, finish_reason: str,
                         timings: RequestTimings | None) -> None:
        """Record one ended request; timings are absent when the client left before the engine answered."""
        self.prompt_tokens.labels(self._model).inc(prompt_tokens)
        self.generation_tokens.labels(self._model).inc(completion_tokens)
        self.request_success.labels(self._model, finish_reason).inc()
        if timings is None:
            return
        if timings.scheduled is not None:
            self.queue_time.labels(self._model).observe(timings.scheduled - timings.queued)
        if timings.first_token is not None:
            self.ttft.labels(self._model).observe(timings.first_token - timings.queued)
        if timings.finished is not None:
            self.e2e.labels(self._model).observe(timings.finished - timings.queued)
        itl = self.itl.labels(self._model)
        for before, after in zip(timings.token_times, timings.token_times[1:], strict=False):
            itl.observe(after - before)

    def request_rejected(self, reason: str) -> None:
        self.rejected.labels(self._model, reason).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)


class _EngineCollector(Collector):
    """Gauges and cumulative counters straight from `Engine.stats()`; nothing is cached between scrapes."""

    def __init__(self, model_name: str, stats: Callable[[], Any | None]) -> None:
        self._model = model_name
        self._stats = stats

    def collect(self) -> Iterator[Metric]:
        stats = self._stats()
        if stats is None:  # still loading: no engine figures yet
            return
        labels = ["model_name"]
        for name, doc, value in (
            ("num_requests_running", "Requests in the running batch.", stats.num_running),
            ("num_requests_waiting", "Requests waiting to start.", stats.num_waiting),
            ("kv_cache_usage_perc", "Fraction of KV cache blocks in use (0..1).", stats.kv_usage),
            ("kv_cache_blocks_total", "KV cache blocks in the pool.", stats.kv_blocks_total),
            ("kv_cache_blocks_free", "KV cache blocks free or evictable.", stats.kv_blocks_free),
        ):
            gauge = GaugeMetricFamily(PREFIX + name, doc, labels=labels)
            gauge.add_metric([self._model], float(value))
            yield gauge
        for name, doc, value in (
            ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", stats.prefix_cache_queries),
            ("prefix_cache_hits", "Prompt tokens found in the prefix cache.", stats.prefix_cache_hits),
            ("num_preemptions", "Requests preempted to free KV blocks.", stats.num_preemptions),
            ("engine_steps", "Engine steps run.", stats.steps),
            ("spec_decode_num_draft_tokens", "Draft tokens verified.", stats.spec_draft_tokens),
            ("spec_decode_num_accepted_tokens", "Draft tokens accepted.", stats.spec_accepted_tokens),
            ("spec_decode_num_emitted_tokens", "Tokens emitted by verifications.", stats.spec_emitted_tokens),
        ):
            counter = CounterMetricFamily(PREFIX + name, doc, labels=labels)
            counter.add_metric([self._model], float(value))
            yield counter
