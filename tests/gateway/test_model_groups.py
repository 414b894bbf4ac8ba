"""Model groups: a public name over channel targets, fallbacks when a whole group is down, and their validation."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import openai
import pytest
from pydantic import ValidationError

from config import GatewaySettings
from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import MockUpstream
from tests.servers import free_port

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]
HI = [{"role": "user", "content": "hi"}]


async def big_falls_back_to_small(upstreams: Start, gateway_for: StartGateway) -> tuple[GatewayHarness,
                                                                                          MockUpstream]:
    """`big` lives on a channel nobody listens on; its fallback `small` on a live one."""
    live = await upstreams()
    channels: list[dict[str, Any]] = [
        {"name": "big-1", "base_url": f"http://127.0.0.1:{free_port()}/v1", "models": {"big": "big-upstream"},
         "health_path": None},
        {"name": "small-1", "base_url": live.base_url, "models": {"small": "small-upstream"}},
    ]
    groups = {"big": {"targets": [{"channel": "big-1", "model": "big-upstream"}], "fallbacks": ["small"]}}
    return await gateway_for([], channels=channels, model_groups=groups), live


async def test_a_group_whose_channels_are_down_falls_back_and_the_header_says_which_model_served(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway, live = await big_falls_back_to_small(upstreams, gateway_for)
    _, secret = await gateway.key()
    client = gateway.client(secret)
    raw = await client.chat.completions.with_raw_response.create(model="big", messages=HI, max_tokens=4)  # type: ignore[arg-type]
    assert raw.headers["x-tidegate-served-model"] == "small"
    assert raw.parse().model == "small"
    assert live.seen_bodies[-1]["model"] == "small-upstream"

    async with client.chat.completions.with_streaming_response.create(
            model="big", messages=HI, max_tokens=4, stream=True) as streamed:  # type: ignore[arg-type]
        assert streamed.headers["x-tidegate-served-model"] == "small"
        assert [chunk.model async for chunk in await streamed.parse()][-1] == "small"

    direct = await client.chat.completions.with_raw_response.create(model="small", messages=HI, max_tokens=4)  # type: ignore[arg-type]
    assert direct.headers["x-tidegate-served-model"] == "small"


async def test_a_key_limited_to_the_group_is_not_served_by_a_fallback_it_may_not_use(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway, live = await big_falls_back_to_small(upstreams, gateway_for)
    _, secret = await gateway.key(models=["big"])
    with pytest.raises(openai.APIStatusError) as refused:
        await gateway.client(secret).chat.completions.create(model="big", messages=HI, max_tokens=4)  # type: ignore[arg-type]
    assert refused.value.status_code in (502, 503)
    assert "x-tidegate-served-model" not in refused.value.response.headers
    assert live.attempts == 0


async def test_invalid_groups_are_refused_with_400_and_valid_ones_serve_at_once(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway, _ = await big_falls_back_to_small(upstreams, gateway_for)
    unknown = await gateway.admin.put("/admin/model-groups/tiny", json={"targets": [{"channel": "nope", "model": "x"}]})
    assert unknown.status_code == 400 and "nope" in unknown.json()["error"]["message"]
    target = {"channel": "small-1", "model": "small-upstream"}
    assert (await gateway.admin.put("/admin/model-groups/a", json={"targets": [target]})).status_code == 200
    assert (await gateway.admin.put("/admin/model-groups/b", json={"targets": [target], "fallbacks": ["a"]})
            ).status_code == 200
    cycle = await gateway.admin.put("/admin/model-groups/a", json={"targets": [target], "fallbacks": ["b"]})
    assert cycle.status_code == 400 and "cycle" in cycle.json()["error"]["message"]
    missing = await gateway.admin.put("/admin/model-groups/c", json={"targets": [target], "fallbacks": ["nowhere"]})
    assert missing.status_code == 400
    shape = await gateway.admin.put("/admin/model-groups/d", json={"targets": []})
    assert shape.status_code == 400 and shape.json()["error"]["type"] == "invalid_request_error"
    assert (await gateway.admin.delete("/admin/model-groups/a")).status_code == 400  # b falls back to it

    _, secret = await gateway.key()
    answer = await gateway.client(secret).chat.completions.with_raw_response.create(model="b", messages=HI,
                                                                                   max_tokens=4)  # type: ignore[arg-type]
    assert answer.headers["x-tidegate-served-model"] == "b"
    channel = (await gateway.admin.get("/admin/channels/small-1")).json()
    assert channel["models"]["b"]["attempts"] == 1 and channel["models"]["b"]["breaker"] == "closed"
    listed = {g["name"]: g for g in (await gateway.admin.get("/admin/model-groups")).json()["data"]}
    assert listed["small"]["implicit"] and not listed["b"]["implicit"] and listed["b"]["fallbacks"] == ["a"]


def test_a_config_file_with_a_fallback_cycle_does_not_load() -> None:
    channel = {"name": "c", "base_url": "http://127.0.0.1:1/v1", "models": ["m"]}
    target = [{"channel": "c", "model": "m"}]
    with pytest.raises(ValidationError, match="cycle"):
        GatewaySettings.model_validate({"channels": [channel], "model_groups": {
            "a": {"targets": target, "fallbacks": ["b"]}, "b": {"targets": target, "fallbacks": ["a"]}}})
