"""What a tenant may make the gateway keep with its responses: OpenAI's bounds on metadata and `user`, and a cap
on one account's stored bytes, on both stores (the embedded SQLite file and a real redis-server)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import MockUpstream
from tests.servers import RedisServer

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]
FULL_METADATA = {f"k{n:02d}".ljust(64, "x"): "v" * 512 for n in range(16)}  # at every bound, ~9 kB


@pytest.fixture(params=["embedded", "redis"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    if request.param == "embedded":
        return {}
    server: RedisServer = request.getfixturevalue("redis_server")
    return {"redis_url": server.url}


@pytest.mark.parametrize("field, value", [
    ("metadata", {f"k{n}": "v" for n in range(17)}),
    ("metadata", {"k" * 65: "v"}),
    ("metadata", {"k": "v" * 513}),
    ("metadata", {"k": 1}),
    ("user", "u" * 257),
    ("safety_identifier", "u" * 257),
])
async def test_metadata_and_user_past_openais_bounds_are_400s(field: str, value: Any, upstreams: Start,
                                                               gateway_for: StartGateway) -> None:
    upstream = await upstreams()
    gateway = await gateway_for([upstream])
    client = gateway.client((await gateway.key())[1])
    with pytest.raises(openai.BadRequestError) as refused:
        await client.responses.create(model="smollm2", input="Hi", max_output_tokens=2, **{field: value})
    assert refused.value.body["param"] == field  # type: ignore[index]
    assert upstream.attempts == 0
    kept = await client.responses.create(model="smollm2", input="Hi", max_output_tokens=2, metadata=FULL_METADATA,
                                         user="u" * 256)
    assert (await client.responses.retrieve(kept.id)).metadata == FULL_METADATA


async def test_an_account_stores_no_more_than_its_cap_and_is_told_so(store: dict[str, Any], upstreams: Start,
                                                                     gateway_for: StartGateway) -> None:
    upstream = await upstreams()
    gateway = await gateway_for([upstream], responses_max_stored_bytes_per_account=24_000, **store)
    client = gateway.client((await gateway.key())[1])
    kept = [await client.responses.create(model="smollm2", input="Hi", max_output_tokens=2, metadata=FULL_METADATA)
            for _ in range(2)]
    assert all(k.store for k in kept)
    with pytest.raises(openai.RateLimitError) as full:  # a third would pass the cap: refused before any work
        await client.responses.create(model="smollm2", input="Hi", max_output_tokens=2, metadata=FULL_METADATA)
    assert full.value.code == "response_storage_full" and upstream.attempts == 2
    unstored = await client.responses.create(model="smollm2", input="Hi", max_output_tokens=2,
                                             metadata=FULL_METADATA, store=False)
    assert unstored.store is False
    # another account has its own room
    other = gateway.client((await gateway.key())[1])
    assert (await other.responses.create(model="smollm2", input="Hi", max_output_tokens=2,
                                         metadata=FULL_METADATA)).store
    # deleting frees the room again
    await client.responses.delete(kept[0].id)
    assert (await client.responses.create(model="smollm2", input="Hi", max_output_tokens=2,
                                          metadata=FULL_METADATA)).store


async def test_an_answer_that_would_pass_the_cap_is_served_but_not_stored(store: dict[str, Any], upstreams: Start,
                                                                          gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()], responses_max_stored_bytes_per_account=4096, **store)
    client = gateway.client((await gateway.key())[1])
    for stream in (False, True):
        if stream:
            events = await client.responses.create(model="smollm2", input="Hi", max_output_tokens=1500, stream=True)
            answer = [e async for e in events][-1].response  # type: ignore[union-attr]
        else:
            answer = await client.responses.create(model="smollm2", input="Hi", max_output_tokens=1500)
        assert len(answer.output_text) > 4096 and answer.store is False
        with pytest.raises(openai.NotFoundError):
            await client.responses.retrieve(answer.id)
