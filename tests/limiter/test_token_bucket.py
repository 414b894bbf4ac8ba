"""The token bucket: the in-memory class and its Lua twin (against a real redis-server) agree."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime

import pytest
from redis.asyncio import Redis

from limiter import TokenBucket, libraries
from quota.rules.calendar import month_index, month_start
from tests.servers import RedisServer


@pytest.mark.parametrize(("rate", "burst", "seconds"), [(10.0, 5.0, 3.0), (100.0, 20.0, 1.5), (0.5, 1.0, 10.0)])
def test_bucket_admits_rate_times_time_plus_burst(rate: float, burst: float, seconds: float) -> None:
    bucket = TokenBucket(rate, burst)
    admitted = 0
    steps = 10_000
    for step in range(steps + 1):
        now = 500.0 + seconds * step / steps
        if bucket.wait(now, 1) == 0:
            bucket.take(now, 1)
            admitted += 1
    assert abs(admitted - (rate * seconds + burst)) <= 1


def test_wait_says_when_the_cost_will_be_there() -> None:
    bucket = TokenBucket(rate=2.0, burst=4.0)
    bucket.take(0.0, 4.0)
    assert bucket.wait(0.0, 3.0) == pytest.approx(1.5)
    assert bucket.wait(1.5, 3.0) == 0


def test_cost_above_burst_passes_a_full_bucket_and_leaves_a_debt() -> None:
    bucket = TokenBucket(rate=1.0, burst=2.0)
    assert bucket.wait(100.0, 5.0) == 0
    bucket.take(100.0, 5.0)
    assert bucket.wait(100.0, 1.0) == pytest.approx(4.0)


def test_refund_fills_at_most_to_the_burst_and_debt_is_at_most_one_burst() -> None:
    bucket = TokenBucket(rate=1.0, burst=10.0)
    bucket.take(0.0, 8.0)
    bucket.adjust(0.0, 100.0)
    assert bucket.level(0.0) == 10.0
    bucket.adjust(0.0, -100.0)
    assert bucket.level(0.0) == -10.0


def test_clock_going_backwards_does_not_mint_tokens() -> None:
    bucket = TokenBucket(rate=1.0, burst=1.0)
    bucket.take(10.0, 1)
    assert bucket.wait(5.0, 1) > 0 and bucket.wait(10.5, 1) > 0
    assert bucket.wait(11.0, 1) == 0


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[Redis]:
    redis = Redis.from_url(redis_server.url, decode_responses=True)
    yield redis
    await redis.aclose()


LUA_STEP = """
local key, now_ms, cost, refund = KEYS[1], tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local s = redis.call('HMGET', key, 'xr', 'xb', 'xk', 'xs')
local b = tb_bucket('x', s[1], s[2], s[3], s[4], now_ms)
local wait = tb_wait_ms(b, cost)
if wait == 0 then
  local out = {}
  tb_stage(b, cost, now_ms, out)
  redis.call('HSET', key, unpack(out))
end
tb_adjust(key, 'x', refund, now_ms)
s = redis.call('HMGET', key, 'xr', 'xb', 'xk', 'xs')
return {wait, tostring(tb_bucket('x', s[1], s[2], s[3], s[4], now_ms).tokens)}
"""


async def test_lua_bucket_matches_the_python_twin(client: Redis) -> None:
    await client.hset("b", mapping={"xr": 3.0, "xb": 7})
    script = client.register_script(libraries() + LUA_STEP)
    twin = TokenBucket(3.0, 7)
    steps = [(0, 5, 0), (100, 4, 0), (200, 4, 2), (1500, 9, 0), (1500, 1, -3), (4000, 2, 1), (4100, 7, 0)]
    for ms, cost, refund in steps:
        now = 1_000.0 + ms / 1000
        wait = twin.wait(now, cost)
        if wait == 0:
            twin.take(now, cost)
        twin.adjust(now, refund)
        got_wait, got_level = await script(keys=["b"], args=[1_000_000 + ms, cost, refund])
        assert got_wait == pytest.approx(wait * 1000, abs=1)
        assert float(got_level) == pytest.approx(twin.level(now), abs=1e-3)


@pytest.mark.parametrize("moment", ["2024-02-29T23:59:59", "2026-12-31T12:00:00", "2000-01-01T00:00:00",
                                    "2100-03-01T00:00:00"])
async def test_lua_calendar_matches_python(client: Redis, moment: str) -> None:
    sec = int(datetime.fromisoformat(moment).replace(tzinfo=UTC).timestamp())
    script = client.register_script(
        libraries() + "\nreturn {month_index(tonumber(ARGV[1])), month_start(tonumber(ARGV[2]))}")
    got = await script(keys=[], args=[sec, month_index(sec) + 1])
    assert got == [month_index(sec), int(month_start(month_index(sec) + 1))]
