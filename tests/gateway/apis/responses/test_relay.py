"""The Responses API over scripted upstreams: a whole (non-streamed) upstream answer, a stream cut after its first
token, and responses kept in Redis with their time to live."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import openai
import pytest
import redis

from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import Fault, MockUpstream
from tests.servers import RedisServer

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]


async def test_a_whole_upstream_answer_is_translated_and_charged(upstreams: Start,
                                                                 gateway_for: StartGateway) -> None:
    upstream = await upstreams()
    gateway = await gateway_for([], channels=[{"name": "whole", "base_url": upstream.base_url,
                                               "models": {"smollm2": "up"}, "stream_upstream": False}])
    key_id, secret = await gateway.key()
    response = await gateway.client(secret).responses.create(model="smollm2", input="Hi", max_output_tokens=3)
    assert upstream.seen_bodies[0]["messages"] == [{"role": "user", "content": "Hi"}]
    assert upstream.seen_bodies[0]["max_tokens"] == 3 and "stream" not in upstream.seen_bodies[0]
    assert response.output_text == "t0 t1 t2 " and response.status == "incomplete"  # the mock stops by length
    assert response.model == "smollm2" and response.usage is not None and response.usage.output_tokens == 3
    usage = await gateway.usage(key_id=key_id)
    assert (usage["requests"], usage["completion_tokens"]) == (1, 3)


async def test_a_stream_cut_after_its_first_token_fails_the_response_and_raises(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams(Fault.cut)])
    key_id, secret = await gateway.key()
    stream = await gateway.client(secret).responses.create(model="smollm2", input="Hi", max_output_tokens=8,
                                                           stream=True)
    seen: list[str] = []
    with pytest.raises(openai.APIError, match="broke off"):
        async for event in stream:
            seen.append(event.type)
    assert seen[0] == "response.created" and "response.output_text.delta" in seen
    assert seen[-1] == "response.failed" and "response.completed" not in seen
    usage = await gateway.usage(key_id=key_id)
    assert usage["requests"] == 1 and usage["completion_tokens"] >= 1  # charged what was generated


async def test_responses_kept_in_redis_expire_after_the_configured_time(
        upstreams: Start, gateway_for: StartGateway, redis_server: RedisServer) -> None:
    gateway = await gateway_for([await upstreams()], redis_url=redis_server.url, responses_ttl_seconds=120)
    _, secret = await gateway.key()
    client = gateway.client(secret)
    first = await client.responses.create(model="smollm2", input="Hi", max_output_tokens=2)
    follow = await client.responses.create(model="smollm2", input="More", previous_response_id=first.id,
                                           max_output_tokens=2)
    assert (await client.responses.retrieve(follow.id)).previous_response_id == first.id
    store = redis.Redis(port=redis_server.port)
    try:
        assert 0 < store.ttl(f"tg:response:{first.id}") <= 120
    finally:
        store.close()
    redis_server.stop()  # the key's auth may still be cached: the store read itself fails then
    with pytest.raises(openai.InternalServerError) as unavailable:
        await client.responses.retrieve(first.id)
    assert unavailable.value.status_code == 503 and unavailable.value.response.headers["retry-after"]


async def test_store_false_is_neither_kept_nor_continued(upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    client = gateway.client((await gateway.key())[1])
    unstored = await client.responses.create(model="smollm2", input="Hi", max_output_tokens=2, store=False)
    assert unstored.store is False and unstored.output_text
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError) as refused:
        await client.responses.create(model="smollm2", previous_response_id=unstored.id, input="Hi",
                                      max_output_tokens=2)
    assert refused.value.body["param"] == "previous_response_id"  # type: ignore[index]


async def test_a_deleted_response_can_no_longer_be_read_or_continued(upstreams: Start,
                                                                     gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    client = gateway.client((await gateway.key())[1])
    kept = await client.responses.create(model="smollm2", input="Hi", max_output_tokens=2)
    with pytest.raises(openai.NotFoundError):  # another account cannot delete it
        await gateway.client((await gateway.key())[1]).responses.delete(kept.id)
    await client.responses.delete(kept.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.retrieve(kept.id)
    with pytest.raises(openai.NotFoundError):
        await client.responses.create(model="smollm2", previous_response_id=kept.id, input="Hi", max_output_tokens=2)


async def test_untranslatable_fields_are_400s_the_sdk_raises_before_any_upstream_call(
        upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams()
    gateway = await gateway_for([upstream])
    client = gateway.client((await gateway.key())[1])
    for extra, param in [({"tools": [{"type": "web_search"}]}, "tools[0].type"),
                         ({"reasoning": {"effort": "high"}}, "reasoning"),
                         ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
                          "input[0].content[0]")]:
        body: dict[str, Any] = {"model": "smollm2", "input": "Hi", **extra}
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.create(**body)
        assert refused.value.body["param"] == param  # type: ignore[index]
    assert upstream.attempts == 0
