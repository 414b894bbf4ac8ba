"""`POST /v1/messages` with the official anthropic client, through a gateway in front of a real backend."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anthropic
import httpx
import pytest

from tests.gateway.harness import GatewayHarness

StartGateway = Callable[..., Awaitable[GatewayHarness]]
HI: Any = [{"role": "user", "content": "Say hello."}]
WEATHER: Any = {"name": "get_weather", "description": "The weather in a city now", "input_schema": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"],
    "additionalProperties": False}}
GREEDY: Any = {"temperature": 0.0}  # the SDK has no sampling parameters any more; the API still takes them
# a forced tool call streams its call once the block is complete: on shared CPUs that can take a while
TIMEOUTS = {"first_token": 100.0, "total": 120.0}


def anthropic_client(gateway: GatewayHarness, secret: str) -> anthropic.AsyncAnthropic:
    return anthropic.AsyncAnthropic(base_url=gateway.url, api_key=secret, max_retries=0, timeout=60)


@pytest.fixture
async def gateway(backend_url: str, gateway_for: StartGateway) -> GatewayHarness:
    return await gateway_for([], channels=[{"name": "backend", "base_url": backend_url, "models": ["smollm2"]}],
                             timeouts=TIMEOUTS)


async def test_a_message_is_answered_and_charged_like_chat(gateway: GatewayHarness) -> None:
    key_id, secret = await gateway.key()
    message = await anthropic_client(gateway, secret).messages.create(
        model="smollm2", max_tokens=6, system="You are terse.", messages=HI, extra_body=GREEDY)
    assert message.type == "message" and message.role == "assistant" and message.model == "smollm2"
    assert message.content[0].type == "text" and message.content[0].text
    assert message.stop_reason in ("max_tokens", "end_turn")
    assert 0 < message.usage.output_tokens <= 6 and message.usage.input_tokens > 0
    usage = await gateway.usage(key_id=key_id)
    assert usage["completion_tokens"] == message.usage.output_tokens
    assert usage["prompt_tokens"] == message.usage.input_tokens + (message.usage.cache_read_input_tokens or 0)


async def test_a_streamed_message_arrives_in_anthropics_events_with_its_usage(gateway: GatewayHarness) -> None:
    key_id, secret = await gateway.key()
    async with anthropic_client(gateway, secret).messages.stream(
            model="smollm2", max_tokens=6, messages=HI, extra_body=GREEDY) as stream:
        kinds = [event.type async for event in stream]
        final = await stream.get_final_message()
    assert kinds[:2] == ["message_start", "content_block_start"]
    assert kinds[-2:] == ["message_delta", "message_stop"] and "text" in kinds
    assert final.content[0].type == "text" and final.content[0].text
    assert 0 < final.usage.output_tokens <= 6
    usage = await gateway.usage(key_id=key_id)
    assert usage["completion_tokens"] == final.usage.output_tokens and usage["requests"] == 1


async def test_a_tool_use_turn_and_its_result(gateway: GatewayHarness) -> None:
    _, secret = await gateway.key()
    client = anthropic_client(gateway, secret)
    ask: Any = [{"role": "user", "content": "What is the weather in Paris?"}]
    forced: Any = {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}
    async with client.messages.stream(model="smollm2", max_tokens=48, messages=ask, tools=[WEATHER],
                                      tool_choice=forced,
                                      extra_body=GREEDY) as stream:
        call = await stream.get_final_message()
    tool_use = call.content[-1]
    assert call.stop_reason == "tool_use" and tool_use.type == "tool_use"
    assert tool_use.name == "get_weather" and isinstance(tool_use.input, dict) and "city" in tool_use.input
    answer = await client.messages.create(model="smollm2", max_tokens=8, tools=[WEATHER], extra_body=GREEDY, messages=[
        *ask, {"role": "assistant", "content": [block.model_dump() for block in call.content]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": tool_use.id, "content": "18C, sunny"}]}])
    assert answer.content and answer.content[0].type == "text"


async def test_refusals_come_in_anthropics_error_shape(gateway: GatewayHarness) -> None:
    _, secret = await gateway.key(quota={"tokens_per_day": 50})
    client = anthropic_client(gateway, secret)
    with pytest.raises(anthropic.AuthenticationError):
        await anthropic_client(gateway, "tg-not-a-key").messages.create(model="smollm2", max_tokens=4, messages=HI)
    with pytest.raises(anthropic.BadRequestError, match="thinking"):
        await client.messages.create(model="smollm2", max_tokens=4, messages=HI,
                                     thinking={"type": "enabled", "budget_tokens": 1024})
    with pytest.raises(anthropic.RateLimitError):  # 4,000 tokens reserved against a budget of 50
        await client.messages.create(model="smollm2", max_tokens=4000, messages=HI)
    async with httpx.AsyncClient(base_url=gateway.url) as raw:
        missing = await raw.post("/v1/messages", headers={"x-api-key": secret, "anthropic-version": "2023-06-01"},
                                 json={"model": "smollm2", "messages": HI})
        unknown = await raw.post("/v1/messages", headers={"authorization": f"Bearer {secret}"},
                                 json={"model": "nope", "max_tokens": 4, "messages": HI})
        bad = [await raw.post("/v1/messages", headers={"x-api-key": secret}, json=body) for body in BAD_BODIES]
        garbled = await raw.post("/v1/messages", headers={"x-api-key": secret}, content=b"{not json")
    assert missing.status_code == 400 and missing.json()["type"] == "error"
    assert missing.json()["error"]["type"] == "invalid_request_error" and "max_tokens" in missing.text
    assert unknown.status_code == 404 and unknown.json()["error"]["type"] == "not_found_error"
    for body, answer in zip([*BAD_BODIES, "{not json"], [*bad, garbled], strict=True):
        assert answer.status_code == 400 and answer.json()["type"] == "error", (body, answer.text)


def _message(**fields: Any) -> dict[str, Any]:
    return {"model": "smollm2", "max_tokens": 4, "messages": HI, **fields}


BAD_BODIES: list[Any] = [
    [1, 2], _message(messages=[]), _message(messages=[{"role": "system", "content": "x"}]),
    _message(messages=[{"role": "user", "content": 5}]), _message(system=5), _message(system=[{"type": "image"}]),
    _message(messages=[{"role": "user", "content": [{"type": "image", "source": "x"}]}]),
    _message(messages=[{"role": "user", "content": [{"type": "tool_result", "content": 5}]}]),
    _message(messages=[{"role": "assistant", "content": [{"type": "tool_use", "name": "f", "input": [1]}]}]),
    _message(tools={"name": "f"}), _message(tools=[{"description": "no name"}]), _message(tool_choice="auto"),
    _message(stop_sequences="END"), _message(metadata="m"), _message(max_tokens=0), _message(max_tokens="4"),
    _message(model=7), _message(stream="yes"), _message(temperature="hot"),
]
