"""Non-streamed requests streamed upstream and assembled by the gateway, and the retry policy around first tokens."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import Fault, MockUpstream
from tests.waiting import wait_until_async

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]
MESSAGES: Any = [{"role": "user", "content": "Count for me"}]
# the first token must come within a second; a whole answer takes twice that
TIMEOUTS = {"connect": 1.0, "first_token": 1.0, "idle": 1.0, "total": 20.0}


def channel(name: str, upstream: MockUpstream, **fields: Any) -> dict[str, Any]:
    return {"name": name, "base_url": upstream.base_url, "models": {"smollm2": "upstream-smollm2"}, **fields}


async def test_a_non_streamed_answer_longer_than_first_token_succeeds_and_settles_its_usage(
        upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams(chunk_delay=0.1)
    gateway = await gateway_for([upstream], timeouts=TIMEOUTS)
    key_id, secret = await gateway.key()
    client = gateway.client(secret)
    chat = await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=20)
    assert chat.choices[0].message.content == "".join(f"t{i} " for i in range(20))
    assert chat.choices[0].finish_reason == "length" and chat.object == "chat.completion"
    assert chat.model == "smollm2"  # the public name, not the upstream's
    text = await client.completions.create(model="smollm2", prompt="Count", max_tokens=15)
    assert text.choices[0].text == "".join(f"t{i} " for i in range(15)) and text.object == "text_completion"
    assert [body["stream"] for body in upstream.seen_bodies] == [True, True]
    assert upstream.attempts == 2  # neither was retried
    assert chat.usage is not None and text.usage is not None
    usage = await gateway.usage(key_id=key_id)
    assert usage["completion_tokens"] == chat.usage.completion_tokens + text.usage.completion_tokens == 35
    assert usage["prompt_tokens"] == chat.usage.prompt_tokens + text.usage.prompt_tokens


async def test_a_channel_that_cannot_stream_gets_a_whole_request(upstreams: Start,
                                                                 gateway_for: StartGateway) -> None:
    upstream = await upstreams()
    gateway = await gateway_for([], channels=[channel("plain", upstream, stream_upstream=False)])
    _, secret = await gateway.key()
    chat = await gateway.client(secret).chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=3)
    assert chat.choices[0].message.content == "t0 t1 t2 "
    assert not upstream.seen_bodies[0].get("stream") and "stream_options" not in upstream.seen_bodies[0]



async def test_an_upstream_that_answers_whole_although_asked_for_a_stream_is_served_as_it_answered(
        upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams(Fault.never_streams)
    gateway = await gateway_for([upstream])
    key_id, secret = await gateway.key()
    chat = await gateway.client(secret).chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=3)
    assert chat.choices[0].message.content == "t0 t1 t2 " and upstream.seen_bodies[0]["stream"] is True
    assert (await gateway.usage(key_id=key_id))["completion_tokens"] == 3


@pytest.mark.parametrize(("fault", "stall_at", "status", "code"), [
    (Fault.none, 3, 504, "upstream_timeout"),  # three tokens, then silence past `idle`
    (Fault.cut, -1, 502, "stream_cut"),  # the upstream drops the connection after half the tokens
])
async def test_a_cut_assembled_answer_is_an_error_charged_for_what_was_generated(
        upstreams: Start, gateway_for: StartGateway, fault: Fault, stall_at: int, status: int, code: str) -> None:
    upstream = await upstreams(fault, stall_at=stall_at)
    gateway = await gateway_for([upstream], timeouts={**TIMEOUTS, "idle": 0.5})
    key_id, secret = await gateway.key()
    with pytest.raises(openai.APIStatusError) as failed:
        await gateway.client(secret).chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=6)
    assert failed.value.status_code == status
    assert isinstance(failed.value.body, dict) and failed.value.body["code"] == code  # an error, never half a body
    usage = await gateway.usage(key_id=key_id)
    assert usage["requests"] == 1 and usage["completion_tokens"] == 3  # the tokens that came before the cut


@pytest.mark.parametrize("stream", [False, True])
async def test_a_first_token_timeout_is_never_retried_on_the_same_channel(
        upstreams: Start, gateway_for: StartGateway, stream: bool) -> None:
    stalled = await upstreams(stall_at=0)  # accepts, sends its headers and role chunk, never a token
    gateway = await gateway_for([stalled], timeouts={**TIMEOUTS, "first_token": 0.5}, retries={"max_attempts": 3})
    _, secret = await gateway.key()
    with pytest.raises(openai.APIStatusError) as failed:  # before the first byte: an HTTP error, even for a stream
        await gateway.client(secret).chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=4,
                                                             stream=stream)
    assert failed.value.status_code == 504
    assert stalled.attempts == 1  # the only channel was not asked again
    # the abandoned generation is cancelled upstream: its connection was closed
    await wait_until_async(lambda: stalled.abandoned == 1, what="the stalled upstream seeing the disconnect")


async def test_a_first_token_timeout_moves_to_another_channel_and_cancels_the_first(
        upstreams: Start, gateway_for: StartGateway) -> None:
    stalled, healthy = await upstreams(stall_at=0), await upstreams()
    # tiers make the order certain: the stalled channel first, the healthy one only on retry
    gateway = await gateway_for([], channels=[channel("stalled", stalled), channel("healthy", healthy, priority=1)],
                                timeouts={**TIMEOUTS, "first_token": 0.5}, retries={"max_attempts": 3})
    _, secret = await gateway.key()
    client = gateway.client(secret)
    for _ in range(2):
        chat = await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=3)
        assert chat.choices[0].message.content == "t0 t1 t2 "
    assert (stalled.attempts, healthy.attempts) == (2, 2)
    await wait_until_async(lambda: stalled.abandoned == 2, what="both stalled attempts cancelled upstream")


async def test_a_server_error_on_the_only_channel_is_retried_there(upstreams: Start,
                                                                   gateway_for: StartGateway) -> None:
    failing = await upstreams(Fault.error_500)
    gateway = await gateway_for([failing], retries={"max_attempts": 3, "backoff_base": 0.01})
    _, secret = await gateway.key()
    with pytest.raises(openai.APIStatusError) as failed:
        await gateway.client(secret).chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=2)
    assert failed.value.status_code == 502 and failing.attempts == 3


async def test_a_non_streamed_client_that_leaves_stops_the_generation_and_is_charged_what_was_generated(
        upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams(chunk_delay=0.05)
    gateway = await gateway_for([upstream], timeouts=TIMEOUTS)
    key_id, secret = await gateway.key()
    body = {"model": "smollm2", "messages": MESSAGES, "max_tokens": 200}  # 10 s of generation
    async with httpx.AsyncClient(base_url=gateway.url, timeout=httpx.Timeout(10, read=0.6)) as http:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up; httpx closes the connection
            await http.post("/v1/chat/completions", json=body, headers={"authorization": f"Bearer {secret}"})
    await wait_until_async(lambda: upstream.abandoned == 1, what="the upstream seeing the gateway hang up")

    async def settled() -> dict[str, int] | None:
        usage = await gateway.usage(key_id=key_id)
        return usage if usage["requests"] == 1 else None

    usage = await wait_until_async(settled, what="the abandoned request settled")
    assert 1 <= usage["completion_tokens"] < 200
