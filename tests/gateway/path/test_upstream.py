"""The upstream client against scripted faulty upstreams: failover, breakers, deadlines, Retry-After."""

from __future__ import annotations

import random
import time
from collections.abc import Awaitable, Callable

import pytest

from common.http_client import HttpClient
from config import Breaker, Channel, Retries, Timeouts
from gateway.channels.router import Router
from gateway.channels.state import ChannelState
from gateway.errors import ApiError
from gateway.path.upstream import UpstreamClient, UpstreamRequest
from tests.gateway.upstreams import Fault, MockUpstream
from tests.servers import free_port

Start = Callable[..., Awaitable[MockUpstream]]
FAST = Timeouts(connect=0.5, first_token=0.5, idle=0.5, total=5.0)


def channel(name: str, base_url: str, *, priority: int = 0) -> ChannelState:
    config = Channel(name=name, base_url=base_url, models=["m"], priority=priority)
    return ChannelState(config, FAST, Breaker(consecutive_failures=2, cooldown=60.0))


def client_for(session: HttpClient, channels: list[ChannelState], attempts: int = 4) -> UpstreamClient:
    retries = Retries(max_attempts=attempts, backoff_base=0.01, backoff_max=0.05)
    return UpstreamClient(Router(channels, random.Random(7)), retries, session, random.Random(7))


def request(stream: bool = False, total: float = 5.0) -> UpstreamRequest:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": stream}
    return UpstreamRequest("m", "/chat/completions", body, stream, time.monotonic() + total)


async def test_every_request_fails_over_to_the_healthy_channel_and_bad_breakers_open(upstreams: Start, session: HttpClient) -> None:
    failing, hanging, healthy = await upstreams(Fault.error_500), await upstreams(Fault.hang), await upstreams()
    refusing = channel("refuse", f"http://127.0.0.1:{free_port()}/v1")
    channels = [refusing, channel("500", failing.base_url), channel("hang", hanging.base_url),
                channel("ok", healthy.base_url)]
    client = client_for(session, channels)
    for stream in (False, True, False, True, False, True):
        started = time.monotonic()
        answer = await client.call(request(stream))
        assert answer.channel.name == "ok" and answer.status == 200
        assert time.monotonic() - started < 5.0
        await answer.finish(True)
    # each bad channel took at most consecutive_failures (2) attempts, then its breaker kept traffic away
    assert 1 <= failing.attempts <= 2 and 1 <= hanging.attempts <= 2
    for bad in channels[:3]:
        assert bad.breaker("m").state.value == "open", bad.name
        assert bad.counters("m").failures == bad.counters("m").attempts
    assert healthy.attempts == 6 and all(c.in_flight == 0 for c in channels)


async def test_a_lower_tier_is_used_only_when_the_first_tier_has_nothing_usable(upstreams: Start, session: HttpClient) -> None:
    first, second = await upstreams(), await upstreams()
    channels = [channel("first", first.base_url), channel("second", second.base_url, priority=1)]
    client = client_for(session, channels)
    for _ in range(3):
        await (await client.call(request())).finish(True)
    assert (first.attempts, second.attempts) == (3, 0)
    first.fault = Fault.error_500
    for _ in range(3):
        await (await client.call(request())).finish(True)
    assert second.attempts == 3 and first.attempts <= 5


async def test_a_hanging_only_channel_answers_504_within_the_deadline(upstreams: Start, session: HttpClient) -> None:
    hanging = await upstreams(Fault.hang)
    client = client_for(session, [channel("hang", hanging.base_url)], attempts=10)
    started = time.monotonic()
    with pytest.raises(ApiError) as refused:
        await client.call(request(total=1.2))
    assert refused.value.status == 504
    assert time.monotonic() - started < 1.5


async def test_a_429_alone_is_retried_after_its_retry_after_then_reported_as_503(upstreams: Start, session: HttpClient) -> None:
    busy = await upstreams(Fault.rate_limited)
    state = channel("busy", busy.base_url)
    client = client_for(session, [state], attempts=3)
    started = time.monotonic()
    with pytest.raises(ApiError) as refused:
        await client.call(request())
    assert refused.value.status == 503 and "retry-after" in refused.value.headers
    assert busy.attempts == 3 and time.monotonic() - started >= 0.4  # two waits of Retry-After 0.2 s
    assert state.breaker("m").state.value == "closed"  # busy is not broken


async def test_no_channel_for_the_model_is_a_503_with_retry_after(session: HttpClient) -> None:
    state = channel("down", "http://127.0.0.1:1/v1")
    state.healthy = False
    with pytest.raises(ApiError) as refused:
        await client_for(session, [state]).call(request())
    assert refused.value.status == 503 and refused.value.code == "no_healthy_channel"


async def test_a_streamed_attempt_asks_the_upstream_for_usage(upstreams: Start, session: HttpClient) -> None:
    healthy = await upstreams()
    answer = await client_for(session, [channel("ok", healthy.base_url)]).call(request(stream=True))
    await answer.finish(True)
    assert healthy.seen_bodies[0]["stream_options"] == {"include_usage": True}
    assert answer.first_events[-1] != b"[DONE]"  # stopped at the first content token
