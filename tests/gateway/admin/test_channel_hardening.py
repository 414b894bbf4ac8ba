"""Run-time channel edits an operator could abuse: repointing a channel to receive its stored api key, and a
health_path that turns the gateway's probes into requests of the operator's making."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.gateway.harness import GatewayHarness
from tests.gateway.kind_upstreams import KindUpstream

StartGateway = Callable[..., Awaitable[GatewayHarness]]
STORED_KEY = "sk-stored-channel-key-8d2f6a1c9e"


@pytest.fixture
async def azure_upstreams() -> AsyncIterator[tuple[KindUpstream, KindUpstream]]:
    pair = (await KindUpstream("azure").start(), await KindUpstream("azure").start())
    yield pair
    for upstream in pair:
        await upstream.stop()


async def test_repointing_a_channel_drops_its_stored_api_key_unless_the_same_request_sets_one(
        azure_upstreams: tuple[KindUpstream, KindUpstream], gateway_for: StartGateway) -> None:
    real, attacker = azure_upstreams
    gateway = await gateway_for([], channels=[])
    added = await gateway.admin.post("/admin/channels", json={
        "name": "cloud", "base_url": real.base_url, "kind": "azure", "api_version": "2024-10-21",
        "models": ["smollm2"], "api_key": STORED_KEY})
    assert added.status_code == 201, added.text
    _, secret = await gateway.key()
    client = gateway.client(secret)

    moved = await gateway.admin.patch("/admin/channels/cloud", json={"base_url": attacker.base_url})
    assert moved.status_code == 200 and moved.json()["api_key_set"] is False
    await client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=2)
    [seen] = attacker.received
    assert STORED_KEY not in str(seen.headers) and not real.received

    # a change that keeps the destination keeps the key; a move that names its key sends that one
    other_key = "sk-new-destination-key-5b7c"
    moved_back = await gateway.admin.patch("/admin/channels/cloud", json={"base_url": real.base_url,
                                                                          "api_key": other_key})
    assert moved_back.json()["api_key_set"] is True
    assert (await gateway.admin.patch("/admin/channels/cloud", json={"weight": 2})).json()["api_key_set"] is True
    await client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=2)
    assert real.received[-1].headers["api-key"] == other_key


@pytest.mark.parametrize("path", ["/health?probe=1", "http://10.0.0.9/health", "//10.0.0.9/health",
                                  "/health#x", "health", "/he alth", "/" + "a" * 300])
async def test_a_health_path_with_a_query_host_or_fragment_is_a_400(
        path: str, azure_upstreams: tuple[KindUpstream, KindUpstream], gateway_for: StartGateway) -> None:
    gateway = await gateway_for([], channels=[])
    channel = {"name": "local", "base_url": azure_upstreams[0].base_url + "/v1", "models": ["m"]}
    refused = await gateway.admin.post("/admin/channels", json={**channel, "health_path": path})
    assert refused.status_code == 400 and "health_path" in refused.json()["error"]["message"]
    assert (await gateway.admin.post("/admin/channels", json={**channel, "health_path": "/v1/health"})).status_code == 201
    patched = await gateway.admin.patch("/admin/channels/local", json={"health_path": path})
    assert patched.status_code == 400 and "health_path" in patched.json()["error"]["message"]
