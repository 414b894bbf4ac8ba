"""The limiter's Lua scripts against a real redis-server: server clock, exact windows, leases, NOSCRIPT."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from redis.asyncio import BlockingConnectionPool, Redis

from limiter import RedisLimiter, libraries
from quota.calendar import month_index, month_start
from tests.servers import RedisServer
from tests.waiting import wait_until_async


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[Redis]:
    redis = Redis(connection_pool=BlockingConnectionPool.from_url(redis_server.url, max_connections=8,
                                                                   decode_responses=True))
    yield redis
    await redis.aclose()


async def test_bucket_admits_rate_times_time_plus_burst_within_one_request(client: Redis) -> None:
    limiter = RedisLimiter(client)
    rate, burst = 50.0, 10.0
    admitted, slowest = 0, 0.0
    started = time.monotonic()
    while time.monotonic() - started < 1.0:
        sent = time.monotonic()
        admitted += (await limiter.take("tg:{t}:bucket", rate=rate, burst=burst)).ok
        slowest = max(slowest, time.monotonic() - sent)
    elapsed = time.monotonic() - started
    # The server's clock decides; ours can differ from it by at most one request's round trip.
    assert abs(admitted - (rate * elapsed + burst)) <= 1 + rate * slowest


async def test_sliding_window_is_exact_under_concurrency(client: Redis) -> None:
    limiter = RedisLimiter(client)
    answers = await asyncio.gather(*(limiter.hit("tg:{t}:window", limit=25, cost=1) for _ in range(300)))
    assert sum(a.ok for a in answers) == 25
    refused = next(a for a in answers if not a.ok)
    assert refused.count == 25 and 0 < refused.retry_after <= 60


async def test_leases_cap_holders_and_lapse_without_renewal(client: Redis) -> None:
    limiter = RedisLimiter(client)
    key = "tg:{t}:leases"
    assert await limiter.acquire(key, "a", limit=2, ttl=2.0)
    assert await limiter.acquire(key, "b", limit=2, ttl=2.0)
    assert not await limiter.acquire(key, "c", limit=2, ttl=2.0)
    assert await limiter.renew([key], "a", ttl=60.0) == 1
    # c gets in once b lapses; a lapsed no later than b unless its renewal held, which d's refusal shows
    await wait_until_async(lambda: limiter.acquire(key, "c", limit=2, ttl=60.0), what="b's lease lapsed")
    assert not await limiter.acquire(key, "d", limit=2, ttl=1.0)
    assert await limiter.release(key, "a")
    assert await limiter.acquire(key, "d", limit=2, ttl=1.0)
    assert await limiter.renew([key], "gone", ttl=1.0) == 0


async def test_scripts_run_again_after_the_script_cache_is_flushed(client: Redis) -> None:
    limiter = RedisLimiter(client)
    assert (await limiter.hit("tg:{t}:w", limit=5)).ok
    await client.script_flush()  # as after a Redis restart: EVALSHA answers NOSCRIPT
    assert (await limiter.hit("tg:{t}:w", limit=5)).ok


@pytest.mark.parametrize("moment", ["2024-02-29T23:59:59", "2026-12-31T12:00:00", "2000-01-01T00:00:00",
                                    "2100-03-01T00:00:00"])
async def test_lua_calendar_matches_python(client: Redis, moment: str) -> None:
    sec = int(datetime.fromisoformat(moment).replace(tzinfo=UTC).timestamp())
    script = client.register_script(
        libraries() + "\nreturn {month_index(tonumber(ARGV[1])), month_start(tonumber(ARGV[2]))}")
    got = await script(keys=[], args=[sec, month_index(sec) + 1])
    assert got == [month_index(sec), int(month_start(month_index(sec) + 1))]


async def test_fixed_window_counts_exactly_and_says_when_it_ends(client: Redis) -> None:
    limiter = RedisLimiter(client)
    answers = await asyncio.gather(*(limiter.count("tg:{t}:fixed", window=3600, limit=40, cost=3)
                                     for _ in range(100)))
    assert sum(a.ok for a in answers) == 13
    refused = next(a for a in answers if not a.ok)
    assert refused.count == 39 and abs(refused.retry_after - (3600 - time.time() % 3600)) < 2


async def test_sliding_window_frees_units_as_their_slots_leave(client: Redis) -> None:
    limiter = RedisLimiter(client)
    key = "tg:{t}:short"
    assert all([(await limiter.hit(key, limit=5, slots=2)).ok for _ in range(5)])
    refused = await limiter.hit(key, limit=5, slots=2)
    assert not refused.ok and 1.0 <= refused.retry_after <= 2.0
    await asyncio.sleep(refused.retry_after + 0.05)
    assert (await limiter.hit(key, limit=5, slots=2, cost=5)).ok  # the whole first slot has left
    assert not (await limiter.hit(key, limit=5, slots=2)).ok
    await asyncio.sleep(4.1)  # more than a window of silence: every slot has left at once
    assert (await limiter.hit(key, limit=5, slots=2, cost=5)).ok
    assert await client.hget(key, "wt") == "5"
