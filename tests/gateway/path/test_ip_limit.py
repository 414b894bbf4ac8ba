"""The per-address limit: a fixed window per client block, before authentication, X-Forwarded-For from
trusted proxies only."""

from __future__ import annotations

import ipaddress
from collections.abc import Awaitable, Callable

import httpx
import openai
import pytest

from config import IpRateLimit
from gateway.path.client_address import resolve_client
from gateway.path.ip_limit import IpWindow
from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import MockUpstream

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]
MESSAGES = [{"role": "user", "content": "Say hello"}]


def window(**fields: object) -> IpWindow:
    return IpWindow(IpRateLimit.model_validate({"rpm": 2, **fields}), clock=lambda: clock[0])


clock = [600.0]


@pytest.mark.parametrize(("peer", "forwarded", "client"), [
    ("203.0.113.9", "198.51.100.1", "203.0.113.9"),  # an untrusted peer's header is ignored
    ("10.0.0.2", "198.51.100.1", "198.51.100.1"),
    ("10.0.0.2", "6.6.6.6, 198.51.100.1, 10.0.0.7", "198.51.100.1"),  # rightmost untrusted; the left is the client's
    ("10.0.0.2", "garbage, 10.0.0.7", "10.0.0.7"),
    ("::ffff:10.0.0.2", "2001:db8::1", "2001:db8::1"),
])
def test_the_client_is_the_rightmost_untrusted_hop(peer: str, forwarded: str, client: str) -> None:
    found = resolve_client(peer, forwarded, [ipaddress.ip_network("10.0.0.0/8")])
    assert found == ipaddress.ip_address(client)


def test_blocks_share_a_window_that_resets_each_minute() -> None:
    limits = window(per_cidr_v4=24)
    one, other = (limits.block(ipaddress.ip_address(a)) for a in ("192.0.2.1", "192.0.2.200"))
    assert one == other == "192.0.2.0/24"
    assert limits.block(ipaddress.ip_address("2001:db8:0:0:ffff::1")) == "2001:db8::/64"
    assert limits.hit(one) is None and limits.hit(other) is None
    assert limits.hit(one) == pytest.approx(60.0)
    clock[0] += 60
    assert limits.hit(one) is None


async def test_the_limit_refuses_before_any_key_lookup(upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()], ip_rate_limit={"rpm": 3, "trusted_proxies": ["127.0.0.1"]})
    guessing = gateway.client("tg-guessed-key")
    for _ in range(3):
        with pytest.raises(openai.AuthenticationError):
            await guessing.chat.completions.create(model="smollm2", messages=MESSAGES)  # type: ignore[arg-type]
    with pytest.raises(openai.RateLimitError) as refused:
        await guessing.chat.completions.create(model="smollm2", messages=MESSAGES)  # type: ignore[arg-type]
    assert refused.value.code == "ip_rate_limit_exceeded"
    assert 1 <= int(refused.value.response.headers["retry-after"]) <= 60
    async with httpx.AsyncClient(base_url=gateway.url) as raw:
        assert (await raw.get("/health")).status_code == 200  # health and metrics are not counted
        behind_proxy = await raw.post("/v1/chat/completions", json={}, headers={"x-forwarded-for": "198.51.100.4"})
        assert behind_proxy.status_code == 401  # another client behind the trusted proxy has its own window


async def test_a_forwarded_header_from_loopback_is_not_believed_by_default(
        upstreams: Start, gateway_for: StartGateway) -> None:
    # the attack: a local process spoofs X-Forwarded-For to get a fresh IP window per request and to pass a key's
    # allowed_ips, and the audit records the address it chose
    gateway = await gateway_for([await upstreams()], ip_rate_limit={"rpm": 4})  # two go to the admin calls
    _, secret = await gateway.key(allowed_ips=["198.51.100.0/24"])
    async with httpx.AsyncClient(base_url=gateway.url, headers={"authorization": f"Bearer {secret}"}) as raw:
        answers = [await raw.post("/v1/chat/completions", json={"model": "smollm2", "messages": MESSAGES},
                                  headers={"x-forwarded-for": f"198.51.100.{i}"}) for i in range(3)]
    assert [a.status_code for a in answers[:2]] == [403, 403]  # the key's allowlist sees the real peer
    assert answers[0].json()["error"]["code"] == "ip_not_allowed"
    assert answers[2].status_code == 429  # one window for the one real address
