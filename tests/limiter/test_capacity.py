"""Shared capacity (the cluster layer's store): buckets and caps taken together, across replicas on one Redis."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator

import pytest
from redis.asyncio import Redis

from limiter import CapacityLimit, MemoryCapacity, RedisCapacity, SharedCapacity
from tests.servers import RedisServer


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[Redis]:
    redis = Redis.from_url(redis_server.url)
    yield redis
    await redis.aclose()


@pytest.fixture(params=["memory", "redis"])
async def capacity(request: pytest.FixtureRequest) -> AsyncIterator[SharedCapacity]:
    if request.param == "memory":
        yield MemoryCapacity()
        return
    redis = Redis.from_url(request.getfixturevalue("redis_server").url)
    yield RedisCapacity(redis)
    await redis.aclose()


async def test_all_limits_or_none_caps_free_on_give_back_and_refunds_refill(capacity: SharedCapacity) -> None:
    channel = CapacityLimit("channel:a", rate=0.001, burst=100, max_concurrency=2)
    model = CapacityLimit("model:m", max_concurrency=5)
    now = time.time()
    assert (await capacity.take([channel, model], 60, "r1", 60, now)).ok
    refused = await capacity.take([channel, model], 60, "r2", 60, now)
    assert not refused.ok and refused.refused == channel and refused.wait > 1000
    await capacity.give_back([channel, model], 50, "r1", now)  # used 10 of the 60 reserved
    assert (await capacity.take([channel, model], 60, "r2", 60, now)).ok  # 100 - 10 - 60 left: 30
    assert (await capacity.take([channel, model], 1, "r3", 60, now)).ok
    busy = await capacity.take([channel, model], 1, "r4", 60, now)
    assert not busy.ok and busy.refused == channel and busy.wait == 1.0  # two leases held
    await capacity.give_back([channel, model], 0, "r2", now)
    assert (await capacity.take([channel, model], 1, "r4", 60, now)).ok


async def test_two_replicas_and_four_tenants_never_push_a_channel_past_its_bucket(client: Redis) -> None:
    """Each tenant pushes as fast as it is let through for 10 s; the takes the store granted, summed per second
    and over the run, stay within rate x time + burst."""
    rate, burst = 2000, 500
    channel = CapacityLimit("channel:c", rate=rate, burst=burst)
    other = Redis.from_url(_url(client))  # a second replica: its own connections, the same Redis
    replicas = [RedisCapacity(client), RedisCapacity(other)]
    granted: list[tuple[float, int]] = []
    started = time.monotonic()

    async def tenant(n: int) -> None:
        rng = random.Random(n)
        i = 0
        while time.monotonic() - started < 10.0:
            cost = rng.randint(50, 400)
            take = await replicas[i % 2].take([channel], cost, f"t{n}-{i}", 30, time.time())
            i += 1
            if take.ok:
                granted.append((time.monotonic() - started, cost))
            else:
                await asyncio.sleep(min(take.wait, 0.05))

    await asyncio.gather(*(tenant(n) for n in range(4)))
    await other.aclose()
    elapsed = time.monotonic() - started
    total = sum(cost for _, cost in granted)
    assert total <= rate * elapsed + burst
    assert total >= rate * elapsed * 0.8  # the channel is kept busy, not starved
    slack = rate * 0.05  # our clock against Redis's, over loopback
    for start in (t for t, _ in granted):
        second = sum(cost for t, cost in granted if start <= t < start + 1.0)
        assert second <= rate + burst + slack, (start, second)


def _url(client: Redis) -> str:
    kwargs = client.connection_pool.connection_kwargs
    return f"redis://{kwargs['host']}:{kwargs['port']}/{kwargs.get('db', 0)}"
