"""Channels: the configured upstream servers, their live load, health and per-model breakers."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import httpx

from config import Breaker as BreakerSettings
from config import Channel, Timeouts
from config.url_credentials import redact_url, split_credentials
from gateway.channels.breaker import CircuitBreaker
from gateway.channels.periodic import Periodic

log = logging.getLogger("tidegate.gateway.channels")


@dataclass(slots=True)
class ChannelStats:
    """Counters for `/admin/channels` and the tests that count attempts."""

    attempts: int = 0
    failures: int = 0


@dataclass(slots=True)
class ChannelState:
    """One channel as the router sees it: config, requests in flight, health and a breaker per model."""

    config: Channel
    timeouts: Timeouts
    breaker_settings: BreakerSettings
    in_flight: int = 0
    healthy: bool = True
    draining: bool = False  # takes no new requests; removed once those in flight are done
    failed_probes: int = 0
    measured_rate: float | None = None  # tokens/s its replicas served (peak of the last minute), rate_from: metrics
    breakers: dict[str, CircuitBreaker] = field(default_factory=dict)
    stats: dict[str, ChannelStats] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return self.config.name

    def breaker(self, model: str) -> CircuitBreaker:
        found = self.breakers.get(model)
        if found is None:
            found = self.breakers[model] = CircuitBreaker(self.breaker_settings)
        return found

    def counters(self, model: str) -> ChannelStats:
        found = self.stats.get(model)
        if found is None:
            found = self.stats[model] = ChannelStats()
        return found

    def has_room(self) -> bool:
        return self.in_flight < self.config.max_concurrency

    def health_url(self) -> str | None:
        if not self.config.health_path:
            return None
        parts = urlsplit(self.config.base_url)
        return f"{parts.scheme}://{parts.netloc}{self.config.health_path}"

    def status(self) -> dict[str, object]:
        return {
            "name": self.name,
            "base_url": redact_url(self.config.base_url),
            "healthy": self.healthy,
            "draining": self.draining,
            "in_flight": self.in_flight,
            "priority": self.config.priority,
            "weight": self.config.weight,
            "token_bucket": self.config.token_bucket.model_dump() if self.config.token_bucket else None,
            "global_max_concurrency": self.config.global_max_concurrency,
            "measured_tokens_per_second": self.measured_rate,
            "models": {
                model: {
                    "upstream_model": upstream,
                    "breaker": self.breaker(model).state.value,
                    "error_rate": round(self.breaker(model).failure_rate(), 4),
                    "attempts": self.counters(model).attempts,
                    "failures": self.counters(model).failures,
                }
                # and the models of groups that target this channel, once they have sent it a request
                for model, upstream in {**dict.fromkeys(self.stats), **self.config.models}.items()
            },
        }


class HealthChecker:
    """Polls each channel's `/health` (never a paid completion) and marks it healthy or not."""

    def __init__(self, channels: list[ChannelState], interval: float, client: httpx.AsyncClient,
                 timeout: float = 2.0, unhealthy_threshold: int = 3):
        self._channels = channels
        self._client = client
        self._timeout = timeout
        self._threshold = unhealthy_threshold
        # channels may be added at run time, so the loop runs even when none has a health path yet
        self._poller = Periodic("channel-health", interval, self.check_all, wait_first=True)

    def start(self) -> None:
        self._poller.start()

    async def stop(self) -> None:
        await self._poller.stop()

    async def check_all(self) -> None:
        await asyncio.gather(*(self._check(c) for c in self._channels))

    async def _check(self, channel: ChannelState) -> None:
        url = channel.health_url()
        if url is None:
            return
        url, auth = split_credentials(url)  # as basic auth, so that httpx's request log shows no password
        try:
            response = await self._client.get(url, auth=auth, timeout=self._timeout)
            ok = response.status_code == 200
        except (httpx.HTTPError, httpx.InvalidURL):  # a run-time channel may carry a URL httpx cannot use
            ok = False
        channel.failed_probes = 0 if ok else channel.failed_probes + 1
        # back in at the first good probe; out only after `threshold` bad ones in a row
        healthy = ok or (channel.healthy and channel.failed_probes < self._threshold)
        if healthy != channel.healthy:
            log.warning("channel %s is now %s", channel.name, "healthy" if healthy else "unhealthy")
        channel.healthy = healthy
