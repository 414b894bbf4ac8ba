"""Bounds on admin writes: list fields and names, writes per caller per minute, keys and sub-accounts per
account, and an audit log that keeps what changed rather than whole records."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import httpx

from tests.gateway.harness import ADMIN_KEY, GatewayHarness
from tests.gateway.upstreams import MockUpstream
from tests.servers import RedisServer

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]


async def test_model_lists_and_names_past_their_bounds_are_400s(upstreams: Start,
                                                                gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    account = await gateway.account()
    key_id, _ = await gateway.key(account_id=account)
    for models in ([f"m{n}" for n in range(1000)], [f"m{n}" for n in range(257)], ["m" * 129]):
        for method, path, body in (("PATCH", f"/admin/keys/{key_id}", {"models": models}),
                                   ("POST", "/admin/keys", {"account_id": account, "models": models}),
                                   ("PATCH", f"/admin/accounts/{account}", {"models": models})):
            refused = await gateway.admin.request(method, path, json=body)
            assert refused.status_code == 400 and "models" in refused.json()["error"]["message"], (path, refused.text)
    assert (await gateway.admin.patch(f"/admin/keys/{key_id}", json={"name": "n" * 201})).status_code == 400
    widest = [f"m{n:03d}".ljust(128, "x") for n in range(256)]
    assert (await gateway.admin.patch(f"/admin/keys/{key_id}", json={"models": widest})).status_code == 200


async def test_the_audit_keeps_the_changed_fields_not_the_whole_record(upstreams: Start,
                                                                      gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    key_id, _ = await gateway.key(models=[f"m{n:03d}".ljust(128, "x") for n in range(256)], name="old")
    for name in ("new", "newer"):
        assert (await gateway.admin.patch(f"/admin/keys/{key_id}", json={"name": name})).status_code == 200
    entries = (await gateway.admin.get("/admin/audit", params={"action": "keys.update"})).json()["data"]
    assert [(e["before"], e["after"]) for e in entries] == [({"name": "new"}, {"name": "newer"}),
                                                            ({"name": "old"}, {"name": "new"})]
    assert all(len(json.dumps(e)) < 1000 for e in entries)  # the 33 kB models list is in none of them
    created = (await gateway.admin.get("/admin/audit", params={"action": "keys.create"})).json()["data"]
    assert created[0]["before"] is None and created[0]["after"]["key"] == "[redacted]"


async def writes_until_refused(client: httpx.AsyncClient, path: str, most: int) -> tuple[int, httpx.Response]:
    """(writes accepted, the first refusal) of up to `most` PATCHes."""
    for done in range(most):
        response = await client.patch(path, json={"name": f"n{done}"})
        if response.status_code != 200:
            return done, response
    raise AssertionError(f"{most} writes, none refused")


async def test_admin_writes_are_limited_per_caller_per_minute_across_replicas(
        upstreams: Start, gateway_for: StartGateway, redis_server: RedisServer) -> None:
    upstream = await upstreams()
    one = await gateway_for([upstream], redis_url=redis_server.url, admin_limits={"writes_per_minute": 6})
    two = await gateway_for([upstream], redis_url=redis_server.url, admin_limits={"writes_per_minute": 6})
    account = await one.account()  # the owner's first write
    operator = (await one.admin.post("/admin/admin-keys", json={"role": "operator"})).json()["key"]
    path = f"/admin/accounts/{account}"
    assert (await two.admin.patch(path, json={"name": "a"})).status_code == 200  # counted on the other replica
    # a minute may turn during the test: then the count starts over once, so the refusal comes within 2 x 6
    done, refused = await writes_until_refused(one.admin, path, 13)
    assert 3 <= done <= 9 and refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "admin_rate_limit_exceeded"
    assert 0 < float(refused.headers["retry-after"]) <= 60
    assert (await two.admin.get(path)).status_code == 200  # reads are not writes
    # another admin identity has its own minute
    headers = {"authorization": f"Bearer {operator}"}
    assert (await two.admin.patch(path, json={"name": "b"}, headers=headers)).status_code == 200


async def test_keys_and_sub_accounts_per_account_are_capped(upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()],
                                admin_limits={"keys_per_account": 2, "sub_accounts_per_account": 1})
    account = await gateway.account()
    first, _ = await gateway.key(account_id=account)
    await gateway.key(account_id=account)
    refused = await gateway.admin.post("/admin/keys", json={"account_id": account})
    assert refused.status_code == 400 and "keys_per_account" in refused.json()["error"]["message"]
    assert (await gateway.admin.delete(f"/admin/keys/{first}")).status_code == 200
    await gateway.key(account_id=account)  # a revoked key makes room
    await gateway.sub_account(account)
    refused = await gateway.admin.post(f"/admin/accounts/{account}/sub-accounts", json={"name": "second"})
    assert refused.status_code == 400 and "sub_accounts_per_account" in refused.json()["error"]["message"]
    assert ADMIN_KEY not in refused.text
