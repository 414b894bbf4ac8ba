"""The streaming relay: chunks pass through, usage is read and stripped, a cut ends with an error event."""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable

from common.event_stream import StreamEnd
from common.http_client import HttpClient
from config import Breaker, Channel, Retries, Timeouts
from gateway.channels.router import Router
from gateway.channels.state import ChannelState
from gateway.path.relay import StreamRelay, rewrite_body
from gateway.path.upstream import Answer, UpstreamClient, UpstreamRequest
from gateway.records import Outcome
from tests.gateway.upstreams import Fault, MockUpstream

Start = Callable[..., Awaitable[MockUpstream]]


async def answer_from(session: HttpClient, upstream: MockUpstream, stream: bool,
                      max_tokens: int = 6, stream_upstream: bool = True) -> Answer:
    config = Channel(name="c", base_url=upstream.base_url, models={"public": "private"},
                     stream_upstream=stream_upstream)
    state = ChannelState(config, Timeouts(connect=1, first_token=2, idle=0.3, total=5), Breaker())
    client = UpstreamClient(Router([state]), Retries(max_attempts=1), session)
    body = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": max_tokens, "stream": stream}
    return await client.call(UpstreamRequest("public", "/chat/completions", body, stream, time.monotonic() + 5))


async def relay_all(relay: StreamRelay) -> list[bytes]:
    ended: list[bool] = []

    async def before_end() -> None:
        ended.append(True)
        await relay.close(StreamEnd.finished)

    written = [batch async for batch in relay.stream(before_end)]
    assert ended == [True]  # the last event goes out after the relay has let go of the upstream
    # a write carries the events of one upstream read: split it back into events
    return [event + b"\n\n" for event in b"".join(written).split(b"\n\n")[:-1]]


async def test_usage_is_read_then_stripped_when_the_client_did_not_ask_for_it(upstreams: Start, session: HttpClient) -> None:
    answer = await answer_from(session, await upstreams(), stream=True)
    relay = StreamRelay(answer, wants_usage=False, deadline=time.monotonic() + 5, idle=1)
    events = await relay_all(relay)
    assert relay.usage is not None and relay.usage.completion_tokens == 6
    assert not any(b'"usage"' in e for e in events)
    assert events[-1] == b"data: [DONE]\n\n" and relay.outcome is Outcome.ok
    models = {json.loads(e[6:])["model"] for e in events[:-1]}
    assert models == {"public"}  # the upstream's own name never reaches the client
    assert answer.channel.in_flight == 0


async def test_usage_is_kept_when_the_client_asked_for_it(upstreams: Start, session: HttpClient) -> None:
    relay = StreamRelay(await answer_from(session, await upstreams(), stream=True), wants_usage=True,
                        deadline=time.monotonic() + 5, idle=1)
    events = await relay_all(relay)
    assert json.loads(events[-2][6:])["usage"]["completion_tokens"] == 6


async def test_a_stream_cut_halfway_ends_with_an_error_event_and_a_channel_failure(upstreams: Start, session: HttpClient) -> None:
    answer = await answer_from(session, await upstreams(Fault.cut), stream=True, max_tokens=8)
    relay = StreamRelay(answer, wants_usage=False, deadline=time.monotonic() + 5, idle=1)
    events = await relay_all(relay)
    assert events[-1].startswith(b"event: error\n")
    assert json.loads(events[-1].split(b"data: ")[1])["error"]["code"] == "stream_cut"
    assert relay.outcome is Outcome.cut and relay.chunks >= 4
    assert answer.channel.counters("public").failures == 1


async def test_an_upstream_stalling_mid_stream_hits_the_idle_deadline(upstreams: Start, session: HttpClient) -> None:
    slow = await upstreams()
    slow.stall_at = 3
    answer = await answer_from(session, slow, stream=True)
    relay = StreamRelay(answer, wants_usage=False, deadline=time.monotonic() + 5, idle=0.3)
    started = time.monotonic()
    events = await relay_all(relay)
    assert relay.outcome is Outcome.timeout and b"upstream_timeout" in events[-1]
    assert time.monotonic() - started < 1.0


async def test_a_whole_answer_gets_the_public_model_name_and_its_usage_read(upstreams: Start, session: HttpClient) -> None:
    answer = await answer_from(session, await upstreams(), stream=False, stream_upstream=False)
    body, usage = rewrite_body(answer)
    await answer.finish(True)
    assert json.loads(body)["model"] == "public" and usage is not None and usage.completion_tokens == 6
