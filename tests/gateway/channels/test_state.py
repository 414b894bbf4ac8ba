from __future__ import annotations

import httpx

from config import Breaker, Channel, Timeouts
from gateway.channels.state import ChannelState, HealthChecker
from tests.gateway.upstreams import MockUpstream
from tests.servers import free_port


async def test_a_channel_leaves_after_consecutive_failed_probes_and_returns_at_the_first_good_one() -> None:
    port = free_port()  # nothing listens yet: every probe is refused
    config = Channel(name="c", base_url=f"http://127.0.0.1:{port}/v1", models={"m": "m"})
    channel = ChannelState(config, Timeouts(), Breaker())
    async with httpx.AsyncClient() as client:
        checker = HealthChecker([channel], interval=60, client=client, timeout=0.5, unhealthy_threshold=3)
        for _ in range(2):
            await checker.check_all()
            assert channel.healthy  # one or two missed probes under load are not an outage
        await checker.check_all()
        assert not channel.healthy and channel.failed_probes == 3
        upstream = await MockUpstream(port=port).start()
        try:
            await checker.check_all()
            assert channel.healthy and channel.failed_probes == 0
        finally:
            await upstream.stop()
