"""Measured throughput per channel, for token buckets with `rate_from: metrics`.

Each poll reads the channel's Prometheus counters of prompt and generated tokens (tidegate's backend and vLLM
name them `..._prompt_tokens_total` and `..._generation_tokens_total`) and turns the increase into tokens per
second. The bucket refills at the peak of the last minute times a headroom, never below its configured rate: an
idle minute does not shrink what the replicas showed they serve, and the headroom lets the bucket find more.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import time
from collections import deque
from collections.abc import Callable
from urllib.parse import urlsplit

import httpx

from config import Channel
from config.url_credentials import split_credentials
from gateway.channels.periodic import Periodic
from gateway.channels.router import Router
from gateway.channels.state import ChannelState

log = logging.getLogger("tidegate.gateway.throughput")
COUNTERS = ("prompt_tokens_total", "generation_tokens_total")
SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{.*\})?\s+(\S+)")
HEADROOM = 1.25
PEAK_WINDOW = 60.0  # seconds of readings whose peak sets the rate


def tokens_served(text: str) -> float | None:
    """The sum of the prompt and generated token counters in a Prometheus text page; None when there are none."""
    total, seen = 0.0, False
    for line in text.splitlines():
        sample = SAMPLE.match(line)
        if sample is not None and sample.group(1).endswith(COUNTERS):
            with contextlib.suppress(ValueError):
                total += float(sample.group(2))
                seen = True
    return total if seen else None


def metrics_url(channel: Channel) -> str:
    parts = urlsplit(channel.base_url)
    return f"{parts.scheme}://{parts.netloc}/metrics"


class ThroughputWatch:
    def __init__(self, router: Router, client: httpx.AsyncClient, interval: float, timeout: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._router = router
        self._client = client
        self._timeout = timeout
        self._clock = clock
        self._last: dict[str, tuple[float, float]] = {}  # channel -> (when, tokens served)
        self._readings: dict[str, deque[tuple[float, float]]] = {}  # channel -> (when, tokens/s)
        self.poller = Periodic("channel-throughput", interval, self.poll_once)

    def rate(self, channel: Channel) -> float | None:
        """The refill rate for the channel's bucket now; None when it has no bucket."""
        bucket = channel.token_bucket
        if bucket is None:
            return None
        peak = self.measured(channel.name)
        return bucket.rate if bucket.rate_from == "config" or peak is None else max(bucket.rate, peak * HEADROOM)

    def measured(self, name: str) -> float | None:
        """The peak tokens per second over the last minute of readings."""
        readings = self._readings.get(name)
        return max(r for _, r in readings) if readings else None

    async def poll_once(self) -> None:
        watched = [c for c in self._router.channels
                   if c.config.token_bucket is not None and c.config.token_bucket.rate_from == "metrics"]
        await asyncio.gather(*(self._read(state) for state in watched))

    async def _read(self, state: ChannelState) -> None:
        channel = state.config
        url, auth = split_credentials(metrics_url(channel))
        try:
            response = await self._client.get(url, auth=auth, timeout=self._timeout)
            served = tokens_served(response.text) if response.status_code == 200 else None
        except httpx.HTTPError:
            served = None
        if served is None:
            return  # no reading: the rate keeps its last minute's peak, then its configured floor
        now = self._clock()
        last = self._last.get(channel.name)
        self._last[channel.name] = (now, served)
        if last is None or now <= last[0] or served < last[1]:  # the first reading, or a restarted replica
            return
        readings = self._readings.setdefault(channel.name, deque())
        readings.append((now, (served - last[1]) / (now - last[0])))
        while readings and readings[0][0] < now - PEAK_WINDOW:
            readings.popleft()
        state.measured_rate = self.measured(channel.name)
