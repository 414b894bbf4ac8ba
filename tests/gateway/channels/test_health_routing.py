"""Health checks as routing sees them: a channel whose /health fails is skipped, never probed with a completion."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import httpx

from config import Breaker, Channel, Timeouts
from gateway.channels.router import Router
from gateway.channels.state import ChannelState, HealthChecker
from tests.gateway.upstreams import MockUpstream

Start = Callable[..., Awaitable[MockUpstream]]


def state(name: str, base_url: str, health_path: str | None = "/health") -> ChannelState:
    config = Channel(name=name, base_url=base_url, models=["m"], health_path=health_path)
    return ChannelState(config, Timeouts(), Breaker())


async def test_an_unhealthy_channel_is_skipped_and_a_channel_without_health_path_is_trusted(
        upstreams: Start) -> None:
    sick, fine = await upstreams(), await upstreams()
    channels = [state("sick", sick.base_url), state("fine", fine.base_url),
                state("no-checks", "http://127.0.0.1:1/v1", health_path=None)]
    router = Router(channels)
    async with httpx.AsyncClient() as client:
        checker = HealthChecker(channels, interval=60, client=client, unhealthy_threshold=1)
        sick.healthy = False
        await checker.check_all()
        assert [c.healthy for c in channels] == [False, True, True]
        assert {router.pick("m").name for _ in range(50)} == {"fine", "no-checks"}  # type: ignore[union-attr]
        sick.healthy = True
        await checker.check_all()
        assert channels[0].healthy
    assert (sick.health_checks, fine.health_checks) == (2, 2)
    assert sick.attempts == 0  # a health check is never a paid completion
