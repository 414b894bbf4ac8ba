"""After a scripted mix of requests, each gateway counter, histogram and gauge holds the expected value."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import openai

from tests.gateway.harness import GatewayHarness
from tests.gateway.upstreams import Fault, MockUpstream
from tests.reliability.processes import metric_value

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]
CHAT = "/v1/chat/completions"


async def _chat(gateway: GatewayHarness, secret: str, model: str = "smollm2") -> int:
    try:
        await gateway.client(secret).chat.completions.create(
            model=model, max_tokens=3, messages=[{"role": "user", "content": "hi"}])
    except openai.APIStatusError as error:
        return error.status_code
    return 200


async def test_counters_and_gauges_after_a_scripted_mix(upstreams: Start, gateway_for: StartGateway) -> None:
    good, bad = await upstreams(), await upstreams(Fault.error_500)
    channels = [{"name": "good", "base_url": good.base_url, "models": ["smollm2"]},
                {"name": "bad", "base_url": bad.base_url, "models": ["flaky"]}]
    gateway = await gateway_for([good, bad], channels=channels, metrics_per_account=True,
                                retries={"max_attempts": 2, "backoff_base": 0.0},
                                breaker={"consecutive_failures": 2, "cooldown": 60.0})
    acme = await gateway.account({"rpm": 100})
    team = await gateway.sub_account(acme, {"rpm": 3})
    _, narrow = await gateway.key(sub_account_id=team, quota={"rpm": 2})
    _, wide = await gateway.key(sub_account_id=team)
    other = await gateway.account({"rpm": 1})
    _, solo = await gateway.key(account_id=other)

    statuses = [await _chat(gateway, narrow) for _ in range(3)]  # the third hits the key's RPM
    statuses += [await _chat(gateway, wide) for _ in range(2)]  # the sub-account has one request left
    statuses += [await _chat(gateway, solo) for _ in range(2)]  # the account allows one
    statuses.append(await _chat(gateway, wide, "flaky"))  # refused before routing: the sub-account is spent
    assert statuses == [200, 200, 429, 200, 429, 200, 429, 429]

    text = (await gateway.admin.get("/metrics")).text
    assert metric_value(text, "tidegate_requests_total", path=CHAT, model="smollm2", channel="good",
                        status="200", outcome="ok") == 4
    assert metric_value(text, "tidegate_requests_total", path=CHAT, status="429") == 4
    assert metric_value(text, "tidegate_refusals_total", level="key", limit="rpm") == 1
    assert metric_value(text, "tidegate_refusals_total", level="sub_account", limit="rpm") == 2
    assert metric_value(text, "tidegate_refusals_total", level="account", limit="rpm") == 1
    assert metric_value(text, "tidegate_tokens_total", account=acme, sub_account=team, kind="completion") == 9
    assert metric_value(text, "tidegate_tokens_total", account=other, sub_account="", kind="completion") == 3
    assert metric_value(text, "tidegate_queue_wait_seconds_count", **{"class": "realtime"}) == 4
    assert metric_value(text, "tidegate_upstream_ttft_seconds_count", channel="good", model="smollm2") == 4
    assert metric_value(text, "tidegate_upstream_seconds_count", channel="good", model="smollm2") == 4
    assert metric_value(text, "tidegate_priority_active", **{"class": "realtime"}) == 0
    assert metric_value(text, "tidegate_channel_in_flight", channel="good") == 0
    assert metric_value(text, "tidegate_store_degraded") == 0


async def test_a_failing_channel_shows_in_requests_and_its_breaker(upstreams: Start,
                                                                  gateway_for: StartGateway) -> None:
    good, bad = await upstreams(), await upstreams(Fault.error_500)
    channels = [{"name": "good", "base_url": good.base_url, "models": ["smollm2"]},
                {"name": "bad", "base_url": bad.base_url, "models": ["flaky"]}]
    gateway = await gateway_for([good, bad], channels=channels, retries={"max_attempts": 2, "backoff_base": 0.0},
                                breaker={"consecutive_failures": 2, "cooldown": 60.0})
    _, secret = await gateway.key()
    assert await _chat(gateway, secret, "flaky") == 502
    assert await _chat(gateway, secret, "flaky") == 503  # the breaker opened after two failed attempts
    text = (await gateway.admin.get("/metrics")).text
    assert bad.attempts == 2
    assert metric_value(text, "tidegate_requests_total", path=CHAT, model="flaky", status="502") == 1
    assert metric_value(text, "tidegate_requests_total", path=CHAT, model="flaky", status="503") == 1
    assert metric_value(text, "tidegate_breaker_state", channel="bad", model="flaky") == 2
    assert metric_value(text, "tidegate_breaker_state", channel="good", model="smollm2") == 0

