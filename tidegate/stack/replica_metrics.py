"""Reading the replicas' load from their /metrics: queue gauges and the TTFT histogram, turned into one sample.

A tidegate backend names its series `tidegate_backend_...`; vLLM names the same ones `vllm:...`; both are read.
The P95 TTFT is over the requests that finished since the previous read, from the difference of the cumulative
histograms (summed over replicas), interpolated within a bucket as Prometheus' histogram_quantile does.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tidegate.stack.autoscale import Sample
from tidegate.stack.processes import local_get

PREFIXES = ("tidegate_backend_", "vllm:")
TTFT = "time_to_first_token_seconds"
Buckets = dict[float, float]  # upper bound -> cumulative count


@dataclass(slots=True)
class ReplicaLoad:
    waiting: float = 0.0
    running: float = 0.0
    ttft_buckets: Buckets = field(default_factory=dict)


def parse_load(text: str) -> ReplicaLoad:
    load = ReplicaLoad()
    for family in text_string_to_metric_families(text):
        name = next((family.name.removeprefix(p) for p in PREFIXES if family.name.startswith(p)), None)
        for sample in family.samples:
            if name == "num_requests_waiting":
                load.waiting += sample.value
            elif name == "num_requests_running":
                load.running += sample.value
            elif name == TTFT and sample.name.endswith("_bucket"):
                upper = float(sample.labels["le"])
                load.ttft_buckets[upper] = load.ttft_buckets.get(upper, 0.0) + sample.value
    return load


def bucket_increase(now: Buckets, before: Buckets) -> Buckets:
    """Counts added since `before`; a replica that restarted starts from zero, so all it has is new."""
    if any(now.get(upper, 0.0) < count for upper, count in before.items()):
        return dict(now)
    return {upper: count - before.get(upper, 0.0) for upper, count in now.items()}


def histogram_quantile(q: float, buckets: Buckets) -> float | None:
    """The q-quantile of cumulative buckets; None when they hold no observation."""
    bounds = sorted(buckets)
    if not bounds or buckets[bounds[-1]] <= 0:
        return None
    rank = q * buckets[bounds[-1]]
    lower, below = 0.0, 0.0
    for upper in bounds:
        count = buckets[upper]
        if count >= rank:
            if math.isinf(upper):
                return lower  # beyond the last finite bound: its bound is the best estimate
            if count == below:
                return upper
            return lower + (upper - lower) * (rank - below) / (count - below)
        lower, below = upper, count
    return lower


class LoadReader:
    """Reads every serving replica's /metrics and keeps each one's last TTFT histogram for the next read."""

    def __init__(self, timeout: float = 2.0):
        self._timeout = timeout
        self._last_buckets: dict[str, Buckets] = {}

    def read(self, metrics_urls: Mapping[str, str], clock: Callable[[], float]) -> Sample | None:
        """One sample over the replicas that answered, stamped when the last answer came; None when none did."""
        answered, waiting, running = 0, 0.0, 0.0
        new: Buckets = {}
        for name, url in metrics_urls.items():
            try:
                response = local_get(url, self._timeout)
                response.raise_for_status()
                load = parse_load(response.text)
            except (httpx.HTTPError, ValueError):
                continue  # a replica busy or restarting this instant: the next read will have it
            answered += 1
            waiting += load.waiting
            running += load.running
            before = self._last_buckets.get(name)
            self._last_buckets[name] = load.ttft_buckets
            if before is None:
                continue  # a replica's first read is its baseline (its warm-up is no load)
            for upper, count in bucket_increase(load.ttft_buckets, before).items():
                new[upper] = new.get(upper, 0.0) + count
        for gone in set(self._last_buckets) - set(metrics_urls):
            del self._last_buckets[gone]
        if not answered:
            return None
        return Sample(clock(), answered, waiting, running, histogram_quantile(0.95, new))
