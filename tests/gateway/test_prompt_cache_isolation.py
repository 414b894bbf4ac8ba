"""The cross-tenant prompt-cache oracle, against a real backend with prefix caching: a tenant that guesses another
tenant's prompt sees no cached tokens, while the same account still reuses its own prefix."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.backend.backend_process import BackendProcess
from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import MockUpstream

BACKEND_TOKEN = "backend-token-for-tests-5e1c9b7a3f2d"

# long enough for several full 16-token KV blocks
SECRET_PROMPT = ("Internal memo, do not share: the merger with Northwind closes on the 14th of March and the "
                 "price is 41 dollars a share. Summarise this memo in one sentence for the board.")


async def _cached_tokens(gateway: GatewayHarness, secret: str) -> int:
    client = gateway.client(secret, timeout=120)
    reply = await client.completions.create(model="smollm2", prompt=SECRET_PROMPT, max_tokens=1, temperature=0)
    assert reply.usage is not None and reply.usage.prompt_tokens > 32
    details = reply.usage.prompt_tokens_details
    return int(details.cached_tokens or 0) if details is not None else 0


async def test_a_guessed_prompt_of_another_account_comes_back_with_no_cached_tokens(
        backend_gateway: GatewayHarness) -> None:
    gateway = backend_gateway
    account_a = await gateway.account()
    _, tenant_a = await gateway.key(account_id=account_a)
    _, tenant_a_other_key = await gateway.key(account_id=account_a)
    _, tenant_b = await gateway.key()
    await _cached_tokens(gateway, tenant_a)  # tenant A's prompt is now in the backend's prefix cache
    assert await _cached_tokens(gateway, tenant_a_other_key) >= 32  # its own account reuses it
    assert await _cached_tokens(gateway, tenant_b) == 0  # a right guess from another account learns nothing


async def test_an_account_with_cache_scope_key_shares_no_cache_between_its_own_keys(
        backend_gateway: GatewayHarness) -> None:
    gateway = backend_gateway
    created = await gateway.admin.post("/admin/accounts", json={"name": "per-key", "cache_scope": "key"})
    assert created.status_code == 201 and created.json()["cache_scope"] == "key"
    account = created.json()["id"]
    _, first = await gateway.key(account_id=account)
    _, second = await gateway.key(account_id=account)
    await _cached_tokens(gateway, first)
    assert await _cached_tokens(gateway, first) >= 32  # a key reuses its own prefix
    assert await _cached_tokens(gateway, second) == 0  # but not another key's, even of the same account
    refused = await gateway.admin.patch(f"/admin/accounts/{account}", json={"cache_scope": "everyone"})
    assert refused.status_code == 400 and "cache_scope" in refused.json()["error"]["message"]
    metrics = (await gateway.admin.get("/metrics")).text  # the hits above, counted for the channel
    hits = next(line for line in metrics.splitlines() if line.startswith("tidegate_channel_prompt_tokens_total{")
                and 'channel="backend"' in line and 'cache="hit"' in line)
    assert float(hits.rsplit(" ", 1)[1]) >= 32


@pytest.fixture(scope="module")
def guarded_backend(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendProcess]:
    """A replica that takes `cache_salt` and `priority` from the gateway's token only."""
    workdir = tmp_path_factory.mktemp("guarded-backend")
    (workdir / "token").write_text(BACKEND_TOKEN + "\n")
    backend = BackendProcess(model_path, workdir / "backend.log", ["--gateway-token-file", str(workdir / "token")])
    try:
        yield backend.start(health_timeout=240)
    finally:
        backend.stop()


async def test_a_client_reaching_the_backend_directly_cannot_read_a_tenant_cache(
        guarded_backend: BackendProcess, tmp_path: Path,
        gateway_for: Callable[..., Awaitable[GatewayHarness]]) -> None:
    # the attack: the salt was an unkeyed digest of the (public) account id, and the backend took cache_salt from
    # anyone who could reach its port: the right guess came back with the tenant's prompt cached
    (tmp_path / "backend_token").write_text(BACKEND_TOKEN)
    channel: dict[str, object] = {"name": "backend", "base_url": guarded_backend.base_url, "models": ["smollm2"],
                                  "api_key_file": str(tmp_path / "backend_token")}
    gateway: GatewayHarness = await gateway_for([], channels=[channel], timeouts={"first_token": 100.0,
                                                                                  "total": 120.0})
    account_a = await gateway.account()
    _, tenant_a = await gateway.key(account_id=account_a)
    await _cached_tokens(gateway, tenant_a)
    assert await _cached_tokens(gateway, tenant_a) >= 32  # through the gateway, with its token, the salt works
    old_salt = hashlib.sha256(f"tidegate-account:{account_a}".encode()).hexdigest()[:32]
    async with httpx.AsyncClient(base_url=guarded_backend.base_url, timeout=120) as direct:
        for forged in ({"cache_salt": old_salt}, {"priority": -100},
                       {"cache_salt": old_salt, "api_key": "x"}):
            headers = {"authorization": f"Bearer {forged.pop('api_key')}"} if "api_key" in forged else {}
            answer = await direct.post("/completions", headers=headers, json={
                "model": "smollm2", "prompt": SECRET_PROMPT, "max_tokens": 1, **forged})
            assert answer.status_code == 400, answer.text
            assert answer.json()["error"]["code"] == "gateway_only_field"
        unsalted = await direct.post("/completions", json={"model": "smollm2", "prompt": SECRET_PROMPT,
                                                            "max_tokens": 1})
    assert unsalted.status_code == 200
    assert (unsalted.json()["usage"].get("prompt_tokens_details") or {}).get("cached_tokens", 0) == 0


async def test_the_channel_sends_the_token_from_its_file(
        upstreams: Callable[..., Awaitable[MockUpstream]], tmp_path: Path,
        gateway_for: Callable[..., Awaitable[GatewayHarness]]) -> None:
    upstream = await upstreams()
    (tmp_path / "token").write_text(BACKEND_TOKEN + "\n")
    gateway = await gateway_for([], channels=[{"name": "c", "base_url": upstream.base_url, "models": ["smollm2"],
                                               "api_key_file": str(tmp_path / "token")}])
    _, secret = await gateway.key()
    await gateway.client(secret).completions.create(model="smollm2", prompt="hi", max_tokens=1)
    assert upstream.seen_headers[-1]["authorization"] == f"Bearer {BACKEND_TOKEN}"
    listed = await gateway.admin.get("/admin/channels/c")
    assert BACKEND_TOKEN not in listed.text
    refused = await gateway.admin.post("/admin/channels", json={"name": "d", "base_url": upstream.base_url,
                                                                "models": ["m"], "api_key_file": "/etc/passwd"})
    assert refused.status_code == 400  # a path on the gateway's disk is never read for an admin
