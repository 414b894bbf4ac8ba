"""Work an upstream accepted: a first token it holds back is the request's fault, never the channel's, and the
request pays for its prompt however it ends."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import openai
import pytest

from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import Fault, MockUpstream

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]
MESSAGES: Any = [{"role": "user", "content": "What is the weather in Oslo?"}]
WEATHER: Any = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


async def test_held_first_tokens_never_open_the_breaker_for_another_tenant_and_are_charged_their_prompt(
        upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams(Fault.holds_tools)
    # one channel: before, five held requests opened its breaker and everyone got 503 no_healthy_channel
    gateway = await gateway_for([upstream], timeouts={"first_token": 1.0, "total": 20.0})
    attacker_id, attacker = await gateway.key()
    _, victim = await gateway.key()
    forced = gateway.client(attacker)

    async def held() -> None:
        with pytest.raises(openai.APIStatusError) as timed_out:
            await forced.chat.completions.create(model="smollm2", messages=MESSAGES, tools=[WEATHER],
                                                 tool_choice="required", max_tokens=50)
        assert timed_out.value.status_code == 504

    await asyncio.gather(*(held() for _ in range(5)))
    plain = await gateway.client(victim).chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=3)
    assert plain.choices[0].message.content
    channels = (await gateway.admin.get("/admin/channels")).json()["data"]
    assert [(m["breaker"], m["failures"]) for c in channels for m in c["models"].values()] == [("closed", 0)]
    usage = await gateway.usage(key_id=attacker_id)
    # the upstream took each request (it answered 200 and prefilled): each pays its prompt
    assert usage["requests"] == 5 and usage["prompt_tokens"] >= 5 * 5 and usage["completion_tokens"] == 0
