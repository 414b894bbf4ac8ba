"""Account ceilings: owners and operators set the models and the most important priority class an account's keys
may use; an account admin cannot raise its keys above them, and no key runs above them whoever wrote it."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import openai
import pytest

from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import MockUpstream

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]
HI = [{"role": "user", "content": "hi"}]


async def test_an_account_admin_cannot_raise_its_keys_above_the_accounts_models_and_class(
        upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams()
    gateway = await gateway_for([], channels=[{"name": "c", "base_url": upstream.base_url,
                                               "models": ["smollm2", "premium"]}], auth_cache_ttl=0)
    created = await gateway.admin.post("/admin/accounts", json={"name": "acme", "models": ["smollm2"],
                                                                "max_priority_class": "batch"})
    assert created.status_code == 201, created.text
    account = created.json()["id"]
    assert created.json()["models"] == ["smollm2"] and created.json()["max_priority_class"] == "batch"
    admin_key = (await gateway.admin.post("/admin/admin-keys", json={"role": "account_admin",
                                                                     "account_id": account})).json()["key"]
    tenant = {"authorization": f"Bearer {admin_key}"}
    key_id, secret = await gateway.key(account_id=account, priority_class="batch", models=["smollm2"])

    # the attack: queue-jump to realtime, clear or widen the models list
    for change in ({"priority_class": "realtime"}, {"models": None}, {"models": ["smollm2", "premium"]}):
        refused = await gateway.admin.patch(f"/admin/keys/{key_id}", json=change, headers=tenant)
        assert refused.status_code == 400, (change, refused.text)
        assert refused.json()["error"]["param"] in change
    refused = await gateway.admin.post("/admin/keys", json={"account_id": account, "priority_class": "realtime"},
                                       headers=tenant)
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "priority_class"
    new = await gateway.admin.post("/admin/keys", json={"account_id": account}, headers=tenant)
    assert new.status_code == 201 and new.json()["models"] == ["smollm2"]  # what the account allows
    narrowed = await gateway.admin.patch(f"/admin/keys/{key_id}", json={"models": ["smollm2"]}, headers=tenant)
    assert narrowed.status_code == 200
    # an account admin cannot lift its account's own ceilings
    lifted = await gateway.admin.patch(f"/admin/accounts/{account}", json={"models": None}, headers=tenant)
    assert lifted.status_code == 403

    # whoever writes the key, requests run within the account's ceilings
    for change in ({"models": None}, {"priority_class": "realtime"}):
        assert (await gateway.admin.patch(f"/admin/keys/{key_id}", json=change)).status_code == 200
    client = gateway.client(secret)
    with pytest.raises(openai.PermissionDeniedError) as denied:
        await client.chat.completions.create(model="premium", messages=HI, max_tokens=2)  # type: ignore[arg-type]
    assert denied.value.code == "model_not_allowed"
    await client.chat.completions.create(model="smollm2", messages=HI, max_tokens=2)  # type: ignore[arg-type]
    assert upstream.seen_bodies[-1]["priority"] == 1  # batch's upstream priority, not realtime's 0
    # a bad ceiling is a 400
    bad = await gateway.admin.patch(f"/admin/accounts/{account}", json={"max_priority_class": "vip"})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "max_priority_class"
    # lifted by an operator, the key gets its own class and models again
    assert (await gateway.admin.patch(f"/admin/accounts/{account}",
                                      json={"models": None, "max_priority_class": None})).status_code == 200
    await client.chat.completions.create(model="premium", messages=HI, max_tokens=2)  # type: ignore[arg-type]
    assert upstream.seen_bodies[-1]["priority"] == 0
