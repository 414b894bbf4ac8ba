"""Shared capacity: several limits (a token bucket and a concurrency cap each) taken together or not at all.

`MemoryCapacity` serves one process; `RedisCapacity` is shared by every process on one Redis (one script call
per take, server time) and falls back to its own memory, at the limits divided by the replicas, while Redis is
out of reach.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Protocol

from redis.asyncio import Redis, RedisCluster

from limiter.leases import LeaseSet
from limiter.lua import compose
from limiter.token_bucket import TokenBucket
from limiter.unreachable import REDIS_DOWN

log = logging.getLogger("tidegate.limiter.capacity")
CAP_RETRY = 1.0  # a concurrency slot frees when some request ends; a second is an honest first guess


@dataclass(slots=True, frozen=True)
class CapacityLimit:
    name: str  # unique per limited thing, such as "channel:local-1" or "model:smollm2"
    rate: float | None = None  # tokens per second; None: no bucket
    burst: int | None = None
    max_concurrency: int | None = None


@dataclass(slots=True)
class CapacityTake:
    ok: bool
    wait: float = 0.0  # seconds until it may fit (when refused)
    refused: CapacityLimit | None = None


@dataclass(slots=True)
class MemoryCapacity:
    buckets: dict[str, TokenBucket] = field(default_factory=dict)
    leases: dict[str, LeaseSet] = field(default_factory=dict)

    async def take(self, limits: Sequence[CapacityLimit], tokens: int, member: str, ttl: float,
                   now: float) -> CapacityTake:
        return self.take_now(limits, tokens, member, ttl, now)

    async def give_back(self, limits: Sequence[CapacityLimit], refund: int, member: str, now: float) -> None:
        self.give_back_now(limits, refund, member, now)

    def take_now(self, limits: Sequence[CapacityLimit], tokens: int, member: str, ttl: float,
             now: float) -> CapacityTake:
        found = []
        for limit in limits:
            bucket = None
            if limit.rate is not None and limit.burst is not None:
                bucket = self.buckets.setdefault(limit.name, TokenBucket(limit.rate, limit.burst))
                wait = bucket.tune(limit.rate, limit.burst).wait(now, tokens)
                if wait > 0:
                    return CapacityTake(False, wait, limit)
            leases = self.leases.setdefault(limit.name, LeaseSet())
            if limit.max_concurrency is not None and leases.live(now) >= limit.max_concurrency:
                return CapacityTake(False, CAP_RETRY, limit)
            found.append((limit, bucket, leases))
        for limit, bucket, leases in found:
            if bucket is not None:
                bucket.take(now, tokens)
            if limit.max_concurrency is not None:
                leases.acquire(member, now, ttl)
        return CapacityTake(True)

    def give_back_now(self, limits: Sequence[CapacityLimit], refund: int, member: str, now: float) -> None:
        for limit in limits:
            bucket = self.buckets.get(limit.name)
            if bucket is not None:
                bucket.adjust(now, refund)
            leases = self.leases.get(limit.name)
            if leases is not None:
                leases.release(member)


class SharedCapacity(Protocol):
    async def take(self, limits: Sequence[CapacityLimit], tokens: int, member: str, ttl: float,
                   now: float) -> CapacityTake: ...

    async def give_back(self, limits: Sequence[CapacityLimit], refund: int, member: str, now: float) -> None: ...


class RedisCapacity:
    def __init__(self, client: Redis | RedisCluster, replicas: int = 1, prefix: str = "tg:{capacity}") -> None:
        self._client = client
        self._take = client.register_script(compose("limiter", "take_capacity"))
        self._give_back = client.register_script(compose("limiter", "give_back_capacity"))
        self._replicas = replicas
        self._prefix = prefix  # one hash tag: a take touches one Cluster slot
        self._local = MemoryCapacity()

    def _keys(self, limits: Sequence[CapacityLimit]) -> list[str]:
        return [f"{self._prefix}:{limit.name}:{part}" for limit in limits for part in ("bucket", "leases")]

    async def take(self, limits: Sequence[CapacityLimit], tokens: int, member: str, ttl: float,
                   now: float) -> CapacityTake:
        args: list[str | int | float] = [tokens, member, int(ttl * 1000)]
        for limit in limits:
            args.extend(("-", "-") if limit.rate is None or limit.burst is None else (limit.rate, limit.burst))
            args.append("-" if limit.max_concurrency is None else limit.max_concurrency)
        try:
            ok, wait_ms, refused = await self._take(keys=self._keys(limits), args=args)
        except REDIS_DOWN as error:
            log.warning("shared capacity out of reach (%s): this replica's share applies", type(error).__name__)
            return self._local.take_now([self._share(limit) for limit in limits], tokens, member, ttl, now)
        return CapacityTake(bool(ok), int(wait_ms) / 1000, limits[int(refused) - 1] if refused else None)

    async def give_back(self, limits: Sequence[CapacityLimit], refund: int, member: str, now: float) -> None:
        self._local.give_back_now(limits, refund, member, now)
        with contextlib.suppress(*REDIS_DOWN):  # the leases lapse by their TTL; a lost refund errs on the safe side
            await self._give_back(keys=self._keys(limits), args=[refund, member])

    def _share(self, limit: CapacityLimit) -> CapacityLimit:
        """This replica's part of a limit while Redis is down."""
        n = self._replicas
        return replace(limit, rate=None if limit.rate is None else limit.rate / n,
                       burst=None if limit.burst is None else max(1, limit.burst // n),
                       max_concurrency=None if limit.max_concurrency is None else max(1, limit.max_concurrency // n))
