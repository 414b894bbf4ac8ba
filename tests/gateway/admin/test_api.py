"""The admin API and `tidegate admin`: tenancy CRUD, quotas, revocation, usage, channel status."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable

import openai

from tests.gateway.harness import ADMIN_KEY, GatewayHarness
from tests.gateway.upstreams import MockUpstream

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]
MESSAGES = [{"role": "user", "content": "hi"}]


async def test_admin_routes_refuse_a_missing_or_wrong_admin_key(upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    for headers in ({}, {"authorization": "Bearer wrong-admin-key"}, {"authorization": "Basic x"}):
        response = await gateway.admin.get("/admin/accounts", headers=headers | {"authorization":
                                           headers.get("authorization", "")})
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_admin_key"
    _, secret = await gateway.key()
    response = await gateway.admin.get("/admin/accounts", headers={"authorization": f"Bearer {secret}"})
    assert response.status_code == 401  # an API key is not an admin key


async def test_keys_show_their_secret_once_and_revocation_is_effective_within_a_second(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    account = await gateway.account(quota={"rpm": 100})
    key_id, secret = await gateway.key(account_id=account, name="ci", models=["smollm2"])
    assert secret.startswith("tg-")
    listed = (await gateway.admin.get("/admin/keys", params={"account_id": account})).json()["data"]
    assert [k["id"] for k in listed] == [key_id] and secret not in json.dumps(listed)
    client = gateway.client(secret)
    await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]
    assert (await gateway.admin.delete(f"/admin/keys/{key_id}")).json()["revoked_at"] is not None
    await asyncio.sleep(1.05)  # the auth cache lives at most one second
    try:
        await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]
        raise AssertionError("a revoked key was accepted")
    except openai.PermissionDeniedError as refused:
        assert refused.code == "key_revoked"


async def test_quotas_are_updated_in_place_and_bad_input_is_a_400_or_404(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    account = await gateway.account()
    team = await gateway.sub_account(account)
    key_id, _ = await gateway.key(sub_account_id=team)
    for path in (f"/admin/accounts/{account}", f"/admin/sub-accounts/{team}", f"/admin/keys/{key_id}"):
        response = await gateway.admin.patch(path, json={"quota": {"rpm": 7}})
        assert response.status_code == 200 and response.json()["quota"] == {"rpm": 7}, path
    assert (await gateway.admin.get(f"/admin/accounts/{account}/sub-accounts")).json()["data"][0]["id"] == team
    bad = [("patch", f"/admin/keys/{key_id}", {"quota": {"rpm": -1}}, 400),
           ("patch", f"/admin/keys/{key_id}", {"secret": "x"}, 400),
           ("patch", "/admin/keys/key-missing", {"name": "x"}, 404),
           ("patch", "/admin/widgets/1", {"name": "x"}, 404),
           ("post", "/admin/keys", {"account_id": "acct-missing"}, 404),
           ("post", "/admin/keys", {}, 400),
           ("post", "/admin/accounts", [1], 400),
           ("delete", "/admin/keys/key-missing", None, 404)]
    for method, path, body, status in bad:
        kwargs = {"json": body} if body is not None else {}
        response = await gateway.admin.request(method.upper(), path, **kwargs)  # type: ignore[arg-type]
        assert response.status_code == status, (method, path, response.text)
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


async def test_usage_is_reported_by_key_and_model_and_channels_by_state(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    key_a, secret_a = await gateway.key()
    _, secret_b = await gateway.key()
    await gateway.client(secret_a).completions.create(model="smollm2", prompt="a", max_tokens=2)
    await gateway.client(secret_b).completions.create(model="smollm2", prompt="b", max_tokens=3)
    mine = await gateway.usage(key_id=key_a)
    assert (mine["requests"], mine["completion_tokens"]) == (1, 2)
    assert (await gateway.usage(model="other"))["requests"] == 0
    assert (await gateway.usage(model="smollm2"))["completion_tokens"] == 5
    assert (await gateway.usage(start="2999-01-01T00:00:00+00:00"))["requests"] == 0
    channels = (await gateway.admin.get("/admin/channels")).json()["data"]
    assert channels[0]["healthy"] and channels[0]["models"]["smollm2"]["attempts"] == 2


async def test_the_admin_cli_drives_the_admin_api(upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])

    async def cli(*argv: str) -> dict[str, object]:
        command = [sys.executable, "-m", "tidegate.cli", "admin", "--url", gateway.url, "--admin-key", ADMIN_KEY,
                   *argv]
        done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr + done.stdout
        return dict(json.loads(done.stdout))

    account = await cli("accounts", "create", "acme", "--rpm", "10", "--token-bucket", "2.5:400")
    assert account["quota"] == {"rpm": 10, "token_bucket": {"rate": 2.5, "burst": 400}}
    key = await cli("keys", "create", "--account-id", str(account["id"]), "--models", "smollm2", "--tpm", "500")
    assert str(key["key"]).startswith("tg-") and key["models"] == ["smollm2"]
    await gateway.client(str(key["key"])).completions.create(model="smollm2", prompt="x", max_tokens=2)
    assert (await cli("usage", "--key-id", str(key["id"])))["completion_tokens"] == 2
    assert (await cli("keys", "revoke", str(key["id"])))["revoked_at"]
    assert (await cli("channels"))["data"]
