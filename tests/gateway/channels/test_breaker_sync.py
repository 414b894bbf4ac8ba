"""Breaker openings shared through a real Redis between two replicas' channel sets."""

from __future__ import annotations

import logging

import pytest
import redis.asyncio as redis

from config import Breaker, Channel, Timeouts
from gateway.channels.breaker import BreakerState
from gateway.channels.breaker_sync import BreakerSync
from gateway.channels.state import ChannelState
from tests.servers import RedisServer
from tests.waiting import wait_until_async


def replica() -> list[ChannelState]:
    config = Channel(name="c", base_url="http://127.0.0.1:1/v1", models=["m"])
    return [ChannelState(config, Timeouts(), Breaker(consecutive_failures=1, cooldown=30))]


async def test_an_opening_on_one_replica_opens_the_breaker_on_the_other(redis_server: RedisServer) -> None:
    first, second = replica(), replica()
    sync_first = BreakerSync(redis.from_url(redis_server.url), first, cooldown=30)
    sync_second = BreakerSync(redis.from_url(redis_server.url), second, cooldown=30)
    try:
        await sync_second.sync_once()
        assert second[0].breaker("m").state is BreakerState.closed
        first[0].breaker("m").record(False)
        await sync_first.sync_once()
        await sync_second.sync_once()
        assert second[0].breaker("m").state is BreakerState.open
        await sync_second.sync_once()  # adopting is not re-publishing, and twice is still one opening
        assert second[0].breaker("m").opened_count == 1
        assert 0 < await sync_first._client.pttl("tidegate:{breaker}:c:m") <= 30_000
    finally:
        await sync_first.stop()
        await sync_second.stop()


async def test_a_replica_without_redis_keeps_serving_on_local_breakers(redis_server: RedisServer,
                                                                      caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="tidegate.gateway.breakers")
    channels = replica()
    sync = BreakerSync(redis.from_url(redis_server.url, socket_timeout=0.2), channels, cooldown=30)
    redis_server.kill()
    sync.start()
    channels[0].breaker("m").record(False)
    await wait_until_async(lambda: sum("breaker sync skipped" in r.getMessage() for r in caplog.records) >= 2,
                           what="two failed sync rounds")
    assert sync._task is not None and not sync._task.done()  # the loop outlives the outage
    assert channels[0].breaker("m").state is BreakerState.open  # and local state still applies
    await sync.stop()
