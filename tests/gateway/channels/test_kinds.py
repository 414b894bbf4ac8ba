"""Azure and Anthropic channels: the wire format their upstreams receive, and their answers read back as chat."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anthropic
import openai
import pytest

from tests.gateway.harness import GatewayHarness
from tests.gateway.kind_upstreams import USAGE_IN, USAGE_OUT, WORDS, KindUpstream

StartGateway = Callable[..., Awaitable[GatewayHarness]]
UPSTREAM_KEY = "sk-upstream-test-3c1d9e7a5b"
MESSAGES: Any = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
WEATHER: Any = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}


@pytest.fixture
async def kind_upstream() -> AsyncIterator[Callable[[str], Awaitable[KindUpstream]]]:
    started: list[KindUpstream] = []

    async def start(kind: str) -> KindUpstream:
        started.append(await KindUpstream(kind).start())
        return started[-1]

    yield start
    for upstream in started:
        await upstream.stop()


async def gateway_over(gateway_for: StartGateway, upstream: KindUpstream, **fields: Any) -> GatewayHarness:
    channel = {"name": upstream.kind, "base_url": upstream.base_url, "kind": upstream.kind, "api_key": UPSTREAM_KEY,
               "models": {"smollm2": "prod-deployment"}, **fields}
    return await gateway_for([], channels=[channel])


async def test_an_azure_channel_gets_its_deployment_paths_api_version_and_api_key(
        kind_upstream: Callable[[str], Awaitable[KindUpstream]], gateway_for: StartGateway) -> None:
    upstream = await kind_upstream("azure")
    gateway = await gateway_over(gateway_for, upstream, api_version="2024-10-21", embeddings=True)
    key_id, secret = await gateway.key()
    client = gateway.client(secret)
    whole = await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=5)
    stream = await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=5, stream=True)
    streamed = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
    assert whole.choices[0].message.content == streamed == "".join(WORDS) and whole.model == "smollm2"
    for seen in upstream.received:  # the two chat requests
        assert seen.path == "/openai/deployments/prod-deployment/chat/completions"
        assert seen.query == {"api-version": "2024-10-21"}
        assert seen.headers["api-key"] == UPSTREAM_KEY and "authorization" not in seen.headers
        assert seen.body["messages"] == MESSAGES and "priority" not in seen.body and "cache_salt" not in seen.body
    embedded = await client.embeddings.create(model="smollm2", input="Hi", encoding_format="float")
    assert embedded.data[0].embedding == [0.5, -0.25] and embedded.model == "smollm2"
    seen = upstream.received[-1]
    assert seen.path == "/openai/deployments/prod-deployment/embeddings" and seen.query == {"api-version": "2024-10-21"}
    assert seen.headers["api-key"] == UPSTREAM_KEY and "authorization" not in seen.headers
    assert seen.body == {"model": "prod-deployment", "input": "Hi", "encoding_format": "float"}
    usage = await gateway.usage(key_id=key_id)
    assert (usage["prompt_tokens"], usage["completion_tokens"]) == (3 * USAGE_IN, 2 * USAGE_OUT)
    added = await gateway.admin.post("/admin/channels", json={
        "name": "azure-2", "base_url": upstream.base_url, "kind": "azure", "models": ["smollm2"]})
    assert added.status_code == 400 and "api_version" in added.json()["error"]["message"]


async def test_an_anthropic_channel_is_spoken_to_in_messages_and_answers_as_chat(
        kind_upstream: Callable[[str], Awaitable[KindUpstream]], gateway_for: StartGateway) -> None:
    upstream = await kind_upstream("anthropic")
    gateway = await gateway_over(gateway_for, upstream)
    key_id, secret = await gateway.key()
    client = gateway.client(secret)
    whole = await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=5)
    assert whole.choices[0].message.content == "".join(WORDS) and whole.choices[0].finish_reason == "stop"
    assert whole.usage is not None and (whole.usage.prompt_tokens, whole.usage.completion_tokens) == (
        USAGE_IN, USAGE_OUT)
    stream = await client.chat.completions.create(model="smollm2", messages=MESSAGES, tools=[WEATHER], stream=True)
    chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    calls = [call for c in chunks if c.choices for call in c.choices[0].delta.tool_calls or ()]
    assert text == "".join(WORDS) and calls[0].function is not None and calls[0].function.name == "get_weather"
    assert "".join(c.function.arguments or "" for c in calls if c.function) == '{"city": "Oslo"}'
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"
    first, second = upstream.received
    assert first.path == "/v1/messages" and first.headers["x-api-key"] == UPSTREAM_KEY
    assert first.headers["anthropic-version"] == "2023-06-01" and "authorization" not in first.headers
    assert first.body == {"model": "prod-deployment", "max_tokens": 5, "stream": True, "system": "Be brief.",
                          "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}]}
    # no limit from the client: the gateway's default_max_tokens, which it reserved, not Messages' own 4096
    assert second.body["max_tokens"] == 512 and second.body["tools"] == [
        {"name": "get_weather", "input_schema": WEATHER["function"]["parameters"]}]
    usage = await gateway.usage(key_id=key_id)
    assert usage["completion_tokens"] == 2 * USAGE_OUT + 5 and usage["prompt_tokens"] == 2 * USAGE_IN


async def test_an_anthropic_channel_is_sent_exactly_the_limit_the_gateway_reserved(
        kind_upstream: Callable[[str], Awaitable[KindUpstream]], gateway_for: StartGateway) -> None:
    upstream = await kind_upstream("anthropic")
    gateway = await gateway_over(gateway_for, upstream)
    _, secret = await gateway.key()
    client = gateway.client(secret)
    # the attack of issue 41: 1 reserved, 4000 sent
    await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_completion_tokens=1,
                                         max_tokens=4000)
    await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=7)
    assert [seen.body["max_tokens"] for seen in upstream.received] == [1, 7]


async def test_an_anthropic_channel_that_answers_whole_and_refuses_in_its_own_shape(
        kind_upstream: Callable[[str], Awaitable[KindUpstream]], gateway_for: StartGateway) -> None:
    upstream = await kind_upstream("anthropic")
    gateway = await gateway_over(gateway_for, upstream, stream_upstream=False, api_version="2024-01-01")
    _, secret = await gateway.key()
    client = gateway.client(secret)
    whole = await client.chat.completions.create(model="smollm2", messages=MESSAGES, tools=[WEATHER], max_tokens=9)
    message = whole.choices[0].message
    assert message.content == "".join(WORDS) and whole.choices[0].finish_reason == "tool_calls"
    assert message.tool_calls is not None and message.tool_calls[0].function.arguments == '{"city": "Oslo"}'
    assert "stream" not in upstream.received[0].body
    assert upstream.received[0].headers["anthropic-version"] == "2024-01-01"
    with pytest.raises(openai.BadRequestError, match="the conversation is too long"):
        await client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "fail"}])
    with pytest.raises(openai.BadRequestError) as untranslatable:
        await client.chat.completions.create(model="smollm2", messages=MESSAGES, logprobs=True)
    assert untranslatable.value.body["param"] == "logprobs"  # type: ignore[index]
    assert len(upstream.received) == 2  # the untranslatable request never left the gateway


async def test_a_messages_client_through_an_anthropic_channel_gets_the_upstreams_answer(
        kind_upstream: Callable[[str], Awaitable[KindUpstream]], gateway_for: StartGateway) -> None:
    upstream = await kind_upstream("anthropic")
    gateway = await gateway_over(gateway_for, upstream)
    _, secret = await gateway.key()
    client = anthropic.AsyncAnthropic(base_url=gateway.url, api_key=secret, max_retries=0, timeout=20)
    tool: Any = {"name": "get_weather", "input_schema": {"type": "object"}}
    async with client.messages.stream(model="smollm2", max_tokens=7, system="Be brief.", tools=[tool],
                                      messages=[{"role": "user", "content": "Hi"}]) as stream:
        message = await stream.get_final_message()
    assert [block.type for block in message.content] == ["text", "tool_use"]
    assert message.content[1].input == {"city": "Oslo"} and message.stop_reason == "tool_use"  # type: ignore[union-attr]
    assert message.usage.output_tokens == USAGE_OUT + 5 and message.usage.input_tokens == USAGE_IN
    sent = upstream.received[0].body
    assert sent["system"] == "Be brief." and sent["tools"] == [tool] and sent["max_tokens"] == 7
