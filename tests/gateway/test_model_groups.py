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


async def test_a_group_without_a_price_reserves_at_its_dearest_target_and_settles_at_the_served_models_price(
        upstreams: Start, gateway_for: StartGateway) -> None:
    """Issue 41: a group without its own price was served free to accounts with a balance."""
    gateway, live = await big_falls_back_to_small(upstreams, gateway_for)
    group = {"targets": [{"channel": "big-1", "model": "big-upstream"}], "fallbacks": ["small"]}
    assert (await gateway.admin.put("/admin/model-groups/team", json=group)).status_code in (200, 201)
    assert (await gateway.admin.put("/admin/prices/big", json={"input": 0, "output": 1000})).status_code == 200
    assert (await gateway.admin.put("/admin/prices/small", json={"input": 0, "output": 100})).status_code == 200
    account_id = await gateway.account()
    await gateway.admin.post(f"/admin/accounts/{account_id}/balance", json={"amount": 0.005})
    key_id, secret = await gateway.key(account_id=account_id)
    client = gateway.client(secret)
    # 4 tokens at big's 0.001 fit the balance; 10 would not, though small would serve them for 0.001
    with pytest.raises(openai.RateLimitError) as refused:
        await client.chat.completions.create(model="team", messages=HI, max_tokens=10)  # type: ignore[arg-type]
    assert refused.value.code == "insufficient_quota"
    raw = await client.chat.completions.with_raw_response.create(model="team", messages=HI, max_tokens=4)  # type: ignore[arg-type]
    assert raw.headers["x-tidegate-served-model"] == "small" and live.seen_bodies[-1]["model"] == "small-upstream"
    usage = await gateway.usage(key_id=key_id)
    assert usage["completion_tokens"] == 4 and usage["cost"] == pytest.approx(4 * 100 / 10**6)  # small's price
    balance = (await gateway.admin.get(f"/admin/accounts/{account_id}/balance")).json()["balance"]
    assert balance == pytest.approx(0.005 - 4 * 100 / 10**6)


async def test_a_model_without_any_price_is_refused_to_accounts_that_pay_and_served_to_others(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway, _ = await big_falls_back_to_small(upstreams, gateway_for)
    paying = await gateway.account()
    await gateway.admin.post(f"/admin/accounts/{paying}/balance", json={"amount": 5})
    _, paying_secret = await gateway.key(account_id=paying)
    with pytest.raises(openai.PermissionDeniedError) as refused:
        await gateway.client(paying_secret).chat.completions.create(model="big", messages=HI, max_tokens=4)  # type: ignore[arg-type]
    assert refused.value.code == "model_not_priced" and "'big'" in refused.value.message
    budgeted = await gateway.account(quota={"budget": {"amount": 5, "window": "month"}})  # type: ignore[dict-item]
    _, budgeted_secret = await gateway.key(account_id=budgeted)
    with pytest.raises(openai.PermissionDeniedError):
        await gateway.client(budgeted_secret).chat.completions.create(model="small", messages=HI, max_tokens=4)  # type: ignore[arg-type]
    _, free_secret = await gateway.key()  # no balance, no budget: nothing to charge, nothing to protect
    served = await gateway.client(free_secret).chat.completions.create(model="small", messages=HI, max_tokens=4)  # type: ignore[arg-type]
    assert served.choices[0].message.content
