"""POST /v1/embeddings: relayed only to channels that declare `embeddings: true`, admitted by an estimate of its
input tokens and settled by the upstream's usage.prompt_tokens, with the official openai client."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import openai
import pytest

from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import MockUpstream
from tests.reliability.processes import metric_value

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]


async def gateway_with_embeddings(upstreams: Start, gateway_for: StartGateway) -> tuple[GatewayHarness, MockUpstream,
                                                                                          MockUpstream]:
    """A gateway with a chat-only channel first and an embeddings channel second, both serving `smollm2`."""
    chat_only, embedder = await upstreams(), await upstreams()
    models = {"smollm2": "upstream-smollm2"}
    gateway = await gateway_for([], channels=[
        {"name": "chat", "base_url": chat_only.base_url, "models": models, "priority": 0},
        {"name": "embedder", "base_url": embedder.base_url, "models": models, "priority": 1, "embeddings": True},
    ])
    return gateway, chat_only, embedder


async def test_embeddings_go_only_to_declaring_channels_and_are_charged_the_upstreams_prompt_tokens(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway, chat_only, embedder = await gateway_with_embeddings(upstreams, gateway_for)
    key_id, secret = await gateway.key()
    texts = ["tidal traffic", "a quiet harbour at dawn"]
    result = await gateway.client(secret).embeddings.create(model="smollm2", input=texts)
    assert [item.embedding for item in result.data] == [[0.5, -0.25, 0.0], [0.5, -0.25, 1.0]]
    assert result.model == "smollm2"  # the public name, not the channel's
    assert chat_only.attempts == 0
    assert [{k: v for k, v in body.items() if k in ("model", "input", "stream")} for body in embedder.seen_bodies] \
        == [{"model": "upstream-smollm2", "input": texts}]
    charged = sum(len(text) for text in texts)  # the upstream's count, one per character
    usage = await gateway.usage(key_id=key_id)
    assert (usage["requests"], usage["prompt_tokens"], usage["completion_tokens"]) == (1, charged, 0)
    metrics = (await gateway.admin.get("/metrics")).text
    assert metric_value(metrics, "tidegate_requests_total", path="/v1/embeddings", model="smollm2",
                        channel="embedder", status="200", outcome="ok") == 1


async def test_an_embeddings_quota_is_used_up_by_the_settled_input_tokens(upstreams: Start,
                                                                          gateway_for: StartGateway) -> None:
    gateway, _, embedder = await gateway_with_embeddings(upstreams, gateway_for)
    _, secret = await gateway.key(quota={"tokens_per_day": 30})
    client = gateway.client(secret)
    await client.embeddings.create(model="smollm2", input="x" * 40)  # estimated at 10 tokens, settled at 40
    with pytest.raises(openai.RateLimitError) as refused:
        await client.embeddings.create(model="smollm2", input="y")
    assert refused.value.code == "insufficient_quota" and embedder.attempts == 1


async def test_embeddings_need_a_declaring_channel_and_cannot_stream(upstreams: Start,
                                                                     gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])  # its one channel does not declare embeddings
    _, secret = await gateway.key()
    client = gateway.client(secret)
    with pytest.raises(openai.NotFoundError):
        await client.embeddings.create(model="smollm2", input="hello")
    with pytest.raises(openai.BadRequestError) as refused:
        await client.embeddings.create(model="smollm2", input="hello", extra_body={"stream": True})
    assert refused.value.body["param"] == "stream"  # type: ignore[index]


async def test_a_run_time_channel_declares_embeddings_through_the_admin_api_unless_anthropic(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    embedder = await upstreams()
    channel = {"name": "late", "base_url": embedder.base_url, "models": ["smollm2"]}
    refused = await gateway.admin.post("/admin/channels", json={**channel, "embeddings": "perhaps"})
    assert refused.status_code == 400 and "embeddings" in refused.json()["error"]["message"]
    anthropic = await gateway.admin.post("/admin/channels", json={**channel, "kind": "anthropic", "embeddings": True})
    assert anthropic.status_code == 400 and "cannot serve embeddings" in anthropic.json()["error"]["message"]
    added = await gateway.admin.post("/admin/channels", json={**channel, "embeddings": True})
    assert added.status_code == 201 and added.json()["settings"]["embeddings"] is True
    _, secret = await gateway.key()
    result = await gateway.client(secret).embeddings.create(model="smollm2", input="hello")
    assert len(result.data) == 1 and embedder.attempts == 1
