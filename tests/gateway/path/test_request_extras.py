"""Tenants cannot reach each other through the upstream: the gateway owns the backend's request extras.

`cache_salt` scopes the upstream's prefix cache per account, so tenant B cannot confirm tenant A's prompt through
`cached_tokens`; `priority` comes from the priority class the gateway chose, never from the client's body, and a
key's class (or the default class) is the most important class its requests can get.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import MockUpstream

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]
MESSAGES = [{"role": "user", "content": "Say hello"}]
CLASSES = {"realtime": {"max_concurrency": 4, "upstream_priority": 0},
           "batch": {"max_concurrency": 4, "upstream_priority": 10}}


async def _send(gateway: GatewayHarness, secret: str, extra: dict[str, Any], stream: bool = False) -> None:
    client = gateway.client(secret)
    reply = await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=2,  # type: ignore[call-overload]
                                                 stream=stream, extra_body=extra)
    if stream:
        async for _ in reply:
            pass


async def test_the_forwarded_body_carries_the_accounts_cache_salt_and_no_client_priority(
        upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams()
    gateway = await gateway_for([upstream], priority_classes=CLASSES)
    account_a = await gateway.account()
    _, tenant_a = await gateway.key(account_id=account_a)
    _, tenant_a_again = await gateway.key(account_id=account_a)
    _, tenant_b = await gateway.key()  # another account
    forged = {"cache_salt": "what-tenant-a-uses", "priority": -1000}  # an integer, which jumped queues before
    for secret in (tenant_a, tenant_a_again, tenant_b):
        for stream in (False, True):
            await _send(gateway, secret, forged, stream)
    salts = [body["cache_salt"] for body in upstream.seen_bodies]
    assert len(set(salts[:4])) == 1  # one account, one cache scope, whichever key
    assert salts[4] == salts[5] != salts[0]  # another account, another scope
    assert "what-tenant-a-uses" not in salts
    assert {body["priority"] for body in upstream.seen_bodies} == {0}  # the realtime class's, not the client's


async def test_a_key_class_and_the_default_class_are_ceilings_the_body_can_only_lower(
        upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams()
    gateway = await gateway_for([upstream], priority_classes=CLASSES, default_priority_class="batch")
    _, unpinned = await gateway.key()
    await _send(gateway, unpinned, {"priority": "realtime"})  # above the default class: served as batch
    _, pinned_batch = await gateway.key(priority_class="batch")
    await _send(gateway, pinned_batch, {"priority": "realtime"})
    _, pinned_realtime = await gateway.key(priority_class="realtime")
    await _send(gateway, pinned_realtime, {"priority": "batch"})  # asking for less is allowed
    await _send(gateway, pinned_realtime, {})
    assert [body["priority"] for body in upstream.seen_bodies] == [10, 10, 10, 0]


async def test_a_channel_without_extras_gets_neither_the_clients_nor_the_gateways(
        upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams()  # stands for a cloud API that rejects fields it does not know
    channel = {"name": "cloud", "base_url": upstream.base_url, "models": {"smollm2": "m"}, "extras": []}
    gateway = await gateway_for([], channels=[channel], priority_classes=CLASSES)
    _, secret = await gateway.key()
    await _send(gateway, secret, {"cache_salt": "x", "priority": 3})
    assert "cache_salt" not in upstream.seen_bodies[-1] and "priority" not in upstream.seen_bodies[-1]


async def test_a_cookie_an_upstream_sets_for_one_tenant_never_reaches_the_upstream_with_another(
        upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams(sets_cookie="lb_session=tenant-a-affinity; Path=/", host="localhost")
    gateway = await gateway_for([upstream])
    _, tenant_a = await gateway.key()
    _, tenant_b = await gateway.key()  # another account
    await _send(gateway, tenant_a, {})
    await _send(gateway, tenant_b, {}, stream=True)
    await _send(gateway, tenant_b, {})
    assert len(upstream.seen_headers) == 3
    assert all("cookie" not in headers for headers in upstream.seen_headers)
