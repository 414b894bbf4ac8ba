"""The cross-tenant prompt-cache oracle, against a real backend with prefix caching: a tenant that guesses another
tenant's prompt sees no cached tokens, while the same account still reuses its own prefix."""

from __future__ import annotations

from tests.gateway.harness import GatewayHarness

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
