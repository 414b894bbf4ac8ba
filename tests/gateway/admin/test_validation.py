"""Admin writes validate every field against its type: a bad value is a 400 naming the field, never stored
(where it would fail every later request on the key) and never a 500."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import MockUpstream

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]
MESSAGES = [{"role": "user", "content": "Say hello"}]
WRONG_VALUES: list[Any] = [["x"], {"a": 1}, 7, True, -1, "", "x" * 5000, None]


async def test_a_bad_priority_class_patch_is_a_400_and_the_key_keeps_working(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    key_id, secret = await gateway.key()
    for bad in (["x"], 5, {"name": "batch"}, "gold"):
        response = await gateway.admin.patch(f"/admin/keys/{key_id}", json={"priority_class": bad})
        assert response.status_code == 400, (bad, response.text)
        assert response.json()["error"]["type"] == "invalid_request_error"
    created = await gateway.admin.post("/admin/keys", json={"account_id": await gateway.account(),
                                                            "priority_class": ["x"]})
    assert created.status_code == 400
    reply = await gateway.client(secret).chat.completions.create(model="smollm2", messages=MESSAGES,  # type: ignore[arg-type]
                                                                 max_tokens=2)
    assert reply.choices[0].message.content
    assert (await gateway.admin.patch(f"/admin/keys/{key_id}", json={"priority_class": "batch"})).status_code == 200


async def test_every_admin_write_answers_each_wrong_type_with_a_4xx(upstreams: Start,
                                                                      gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    account_id = await gateway.account()
    sub_id = await gateway.sub_account(account_id)
    key_id, secret = await gateway.key(account_id=account_id)
    writes: list[tuple[str, str, dict[str, Any], tuple[str, ...]]] = [
        ("POST", "/admin/accounts", {"name": "a"}, ("name", "quota")),
        ("POST", f"/admin/accounts/{account_id}/sub-accounts", {"name": "s"}, ("name", "quota")),
        ("POST", "/admin/keys", {"account_id": account_id},
         ("account_id", "sub_account_id", "name", "models", "quota", "priority_class", "expires_at")),
        ("PATCH", f"/admin/accounts/{account_id}", {}, ("name", "quota")),
        ("PATCH", f"/admin/sub-accounts/{sub_id}", {}, ("name", "quota")),
        ("PATCH", f"/admin/keys/{key_id}", {}, ("name", "models", "quota", "priority_class", "expires_at")),
    ]
    for method, path, base, names in writes:
        for name in names:
            for value in [*WRONG_VALUES, {"rpm": "many"}, {"rpm": 1.5}]:
                response = await gateway.admin.request(method, path, json={**base, name: value})
                assert response.status_code < 500, (method, path, name, value, response.text)
                assert "error" in response.json() or response.status_code in (200, 201)
    reply = await gateway.client(secret).chat.completions.create(model="smollm2", messages=MESSAGES,  # type: ignore[arg-type]
                                                                 max_tokens=2)
    assert reply.choices[0].message.content  # whatever was accepted left the key usable
