"""The cluster layer: a token bucket and a global concurrency cap per channel and per model, shared by replicas.

The router proposes a channel; one whose limits cannot take the request now is set aside and the router is
asked again (another channel of the tier, then a later tier). When none can, the request waits, within its
priority class's queue_timeout, for the soonest to have room, and is then refused 503 `overloaded`.
Tokens are reserved as the admission estimate and corrected with the real usage when the request ends.
"""

from __future__ import annotations

import asyncio
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass

from config import GatewaySettings, ModelLimits, TokenBucket
from gateway.channels.affinity import RoutedPrefix
from gateway.channels.router import Pick, Router, any_model
from gateway.channels.state import ChannelState
from gateway.channels.throughput import ThroughputWatch
from gateway.errors import ApiError, unavailable
from limiter import CapacityLimit, SharedCapacity

NO_LIMITS = ModelLimits()


@dataclass(slots=True)
class CapacityHold:
    """What one request took from the shared limits, to give back when it ends."""

    limits: tuple[CapacityLimit, ...]
    tokens: int
    member: str


@dataclass(slots=True)
class CapacityAsk:
    model: str
    tokens: int  # the admission estimate: prompt plus max output tokens
    request_id: str
    wait: float  # how long the request may wait for room: its priority class's queue_timeout


def _limit(name: str, bucket: TokenBucket | None, cap: int | None) -> list[CapacityLimit]:
    if bucket is None and cap is None:
        return []
    return [CapacityLimit(name, bucket.rate if bucket else None, bucket.burst if bucket else None, cap)]


class ChannelLimits:
    def __init__(self, settings: GatewaySettings, store: SharedCapacity,
                 throughput: ThroughputWatch | None = None) -> None:
        self._store = store
        self._throughput = throughput
        self._models = settings.models_limits
        # no renewal: a request never outlives the total deadline, so its lease may not either
        self._ttl = settings.timeouts.total + settings.lease_ttl

    def limits(self, channel: ChannelState, model: str) -> tuple[CapacityLimit, ...]:
        config = channel.config
        per_model = self._models.get(model) or NO_LIMITS
        bucket = config.token_bucket
        if bucket is not None and bucket.rate_from == "metrics" and self._throughput is not None:
            bucket = bucket.model_copy(update={"rate": self._throughput.rate(config)})
        return (*_limit(f"channel:{config.name}", bucket, config.global_max_concurrency),
                *_limit(f"model:{model}", per_model.token_bucket, per_model.global_max_concurrency))

    async def pick(self, router: Router, ask: CapacityAsk, tried: set[str], barred: set[str],
                   allowed: Callable[[str], bool] = any_model,
                   prefix: RoutedPrefix | None = None) -> tuple[Pick | None, CapacityHold | None]:
        """A target with room for the request (of its model or an allowed fallback), and what was taken there;
        (None, None) when no target is usable."""
        give_up = time.monotonic() + ask.wait
        while True:
            full: set[str] = set()
            soonest: float | None = None
            while (found := router.route(ask.model, tried, barred | full, allowed, prefix)) is not None:
                limits = self.limits(found.channel, found.model)
                if not limits:
                    return found, None
                member = f"{ask.request_id}:{secrets.token_hex(6)}"
                take = await self._store.take(limits, ask.tokens, member, self._ttl, time.time())
                if take.ok:
                    return found, CapacityHold(limits, ask.tokens, member)
                found.channel.breaker(found.model).abandon()  # a half-open probe it claimed goes to the next request
                full.add(found.channel.name)
                soonest = take.wait if soonest is None else min(soonest, take.wait)
            if soonest is None:
                return None, None
            left = give_up - time.monotonic()
            if left <= 0:
                raise _overloaded(ask.model, soonest)
            await asyncio.sleep(min(soonest, left))

    async def release(self, hold: CapacityHold, used_tokens: int) -> None:
        await self._store.give_back(hold.limits, hold.tokens - used_tokens, hold.member, time.time())


def _overloaded(model: str, retry_after: float) -> ApiError:
    return unavailable(f"overloaded: the channels serving {model!r} are at their shared throughput or concurrency "
                       "limits; retry later", retry_after=max(retry_after, 0.001), code="overloaded")
