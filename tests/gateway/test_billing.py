"""Money at the gateway: prices and balances through the admin API, what a cut stream costs, refusals in
OpenAI's shape, spend counters, and usage reports grouped over periods as JSON and CSV."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Awaitable, Callable
from decimal import Decimal

import openai
import pytest

from gateway.path.admission import bound_output, estimate_prompt_tokens
from tests.gateway.harness import ADMIN_KEY, GatewayHarness
from tests.gateway.upstreams import Fault, MockUpstream
from tests.servers import RedisServer

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]
MESSAGES = [{"role": "user", "content": "Say hello"}]
PRICE = {"input": 1.0, "cached_input": 0.5, "output": 2.0}  # 1 and 2 micro-units per token


def test_the_maximum_cost_counts_every_choice_a_request_asks_for() -> None:
    assert bound_output({"max_tokens": 5, "n": 3}, True, 512) == 15
    assert bound_output({"max_completion_tokens": 7, "max_tokens": 5}, True, 512) == 7
    assert bound_output({"n": True}, True, 512) == 512


async def test_a_stream_cut_halfway_is_charged_for_what_was_generated(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams(Fault.cut)], metrics_per_account=True)
    assert (await gateway.admin.put("/admin/prices/smollm2", json=PRICE)).status_code == 200
    key_id, secret = await gateway.key()
    stream = await gateway.client(secret).chat.completions.create(
        model="smollm2", messages=MESSAGES, max_tokens=8, stream=True)  # type: ignore[arg-type]
    generated = 0
    with pytest.raises(openai.APIError):
        async for chunk in stream:
            generated += bool(chunk.choices and chunk.choices[0].delta.content)
    assert 0 < generated < 8
    usage = await gateway.usage(key_id=key_id)
    row = usage["rows"][0]
    assert row["completion_tokens"] == generated and row["channel"] == "c0"
    expected = (Decimal(row["prompt_tokens"]) * 1 + generated * 2) / 10**6
    assert Decimal(str(usage["cost"])) == expected and usage["currency"] == "USD"
    audit = (await gateway.admin.get(f"/admin/accounts/{row['account_id']}/requests")).json()["data"]
    assert [(r["key_id"], r["completion_tokens"], r["outcome"]) for r in audit] == [(key_id, generated, "cut")]
    metrics = (await gateway.admin.get("/metrics")).text
    assert f'tidegate_spend_total{{account="{row["account_id"]}",model="smollm2"}} {float(expected)}' in metrics


async def test_a_prepaid_account_is_refused_with_insufficient_quota_naming_the_account(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()], currency="EUR")
    await gateway.admin.put("/admin/prices/smollm2", json=PRICE)
    account_id = await gateway.account()
    top_up = await gateway.admin.post(f"/admin/accounts/{account_id}/balance", json={"amount": 0.0001, "note": "t"})
    assert top_up.status_code == 201 and top_up.json()["balance"] == 0.0001
    _, secret = await gateway.key(account_id=account_id)
    client = gateway.client(secret)
    await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=10)  # type: ignore[arg-type]
    with pytest.raises(openai.RateLimitError) as refused:
        await client.chat.completions.create(model="smollm2", messages=MESSAGES, max_tokens=100)  # type: ignore[arg-type]
    assert refused.value.code == "insufficient_quota" and "account" in refused.value.message
    balance = (await gateway.admin.get(f"/admin/accounts/{account_id}/balance")).json()
    assert balance["currency"] == "EUR" and 0 < balance["balance"] < 0.0001
    assert [entry["note"] for entry in balance["journal"]] == ["t"]


async def test_usage_reports_group_by_account_and_model_per_period_as_json_and_csv(
        upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams()
    gateway = await gateway_for([], channels=[{"name": "own", "base_url": upstream.base_url, "models": ["smollm2"],
                                               "cost_per_hour": 1.5}])
    await gateway.admin.put("/admin/prices/smollm2", json=PRICE)
    _, secret = await gateway.key()
    for max_tokens in (2, 3):
        await gateway.client(secret).completions.create(model="smollm2", prompt="a", max_tokens=max_tokens)
    for granularity in ("hour", "day", "month"):
        report = await gateway.usage(group_by="account,model", granularity=granularity)
        assert len(report["data"]) == 1 and report["requests"] == 2
        row = report["data"][0]
        assert set(row) >= {"period_start", "account", "model", "prompt_tokens", "cached_tokens",
                            "completion_tokens", "requests", "cost"}
        assert row["completion_tokens"] == 5 and Decimal(str(row["cost"])) == (row["prompt_tokens"] + 10) / Decimal(10**6)
    csv = await gateway.admin.get("/admin/usage", params={"group_by": "model", "format": "csv"})
    assert csv.headers["content-type"].startswith("text/csv")
    header, line = csv.text.splitlines()
    assert header == "period_start,model,prompt_tokens,cached_tokens,completion_tokens,requests,cost"
    assert line.split(",")[1] == "smollm2" and line.split(",")[5] == "2"
    unit = (await gateway.admin.get("/admin/usage/unit-cost")).json()["data"]
    assert [(u["channel"], u["tokens"]) for u in unit] == [("own", report["prompt_tokens"] + 5)]
    today = unit[0]
    assert today["cost_per_million_tokens"] == pytest.approx(today["running_cost"] * 1e6 / today["tokens"], rel=1e-3)
    prices = (await gateway.admin.get("/admin/prices")).json()["data"]
    assert [(p["model"], p["input"], p["output"]) for p in prices] == [("smollm2", 1.0, 2.0)]


async def test_bad_money_input_is_a_400_or_404_in_the_openai_shape(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    account_id = await gateway.account()
    cases = [
        ("put", "/admin/prices/smollm2", {"input": -1, "output": 1}, 400),
        ("put", "/admin/prices/smollm2", {"input": "cheap", "output": 1}, 400),
        ("put", "/admin/prices/smollm2", {"output": 1}, 400),
        ("put", "/admin/prices/smollm2", {"input": 1, "output": 1, "currency": "USD"}, 400),
        ("put", "/admin/prices/smollm2", {"input": 1, "output": 1, "effective_from": "yesterday"}, 400),
        ("put", "/admin/prices/smollm2", {"input": 1e-9, "output": 1}, 400),
        ("post", f"/admin/accounts/{account_id}/balance", {"amount": 0}, 400),
        ("post", f"/admin/accounts/{account_id}/balance", {"amount": True}, 400),
        ("post", "/admin/accounts/acct_nobody/balance", {"amount": 1}, 404),
        ("get", "/admin/accounts/acct_nobody/balance", None, 404),
        ("post", "/admin/accounts", {"name": "x", "quota": {"budget": {"amount": 5, "window": "fortnight"}}}, 400),
        ("post", "/admin/accounts", {"name": "x", "quota": {"budget": {"amount": -5, "window": "day"}}}, 400),
        ("post", "/admin/accounts", {"name": "x", "timezone": "Mars/Olympus"}, 400),
        ("post", "/admin/accounts", {"name": "x", "timezone": "America"}, 400),
        ("post", "/admin/accounts", {"name": "x", "timezone": "x" * 300}, 400),
        ("post", "/admin/accounts", {"name": "x", "quota": {"budget": {"amount": 1e12, "window": "day"}}}, 400),
        ("patch", f"/admin/accounts/{account_id}", {"price_multiplier": 0}, 400),
        ("get", "/admin/usage?group_by=tenant", None, 400),
        ("get", "/admin/usage?granularity=year", None, 400),
        ("get", "/admin/usage?group_by=model&format=xml", None, 400),
    ]
    for method, path, body, status in cases:
        kwargs = {"json": body} if body is not None else {}
        response = await gateway.admin.request(method.upper(), path, **kwargs)  # type: ignore[arg-type]
        assert response.status_code == status, (method, path, response.text)
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


async def test_the_admin_cli_sets_prices_tops_up_and_exports_usage_as_csv(
        upstreams: Start, gateway_for: StartGateway) -> None:
    gateway = await gateway_for([await upstreams()])
    account_id = await gateway.account()

    async def cli(*argv: str) -> str:
        command = [sys.executable, "-m", "tidegate.cli", "admin", "--url", gateway.url, "--admin-key", ADMIN_KEY,
                   *argv]
        done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr + done.stdout
        return done.stdout

    price = json.loads(await cli("prices", "set", "smollm2", "--input", "0.15", "--output", "0.6"))
    assert (price["input"], price["cached_input"], price["output"]) == (0.15, 0.15, 0.6)
    entry = json.loads(await cli("balance", "top-up", account_id, "--amount", "12.5", "--note", "invoice 7"))
    assert (entry["amount"], entry["balance"], entry["note"]) == (12.5, 12.5, "invoice 7")
    _, secret = await gateway.key(account_id=account_id)
    await gateway.client(secret).completions.create(model="smollm2", prompt="a", max_tokens=2)
    exported = await cli("usage", "--group-by", "account,model", "--granularity", "month", "--format", "csv")
    assert exported.splitlines()[1].split(",")[1:3] == [account_id, "smollm2"]
    per_model = json.loads(await cli("unit-cost", "--by", "model"))
    assert per_model["by"] == "model"


async def test_forty_concurrent_requests_through_two_gateway_replicas_spend_exactly_a_budget_for_25(
        upstreams: Start, gateway_for: StartGateway, redis_server: RedisServer) -> None:
    upstream = await upstreams(chunk_delay=0.6)  # each answer takes 3 s: all 40 are admitted while 25 are held
    first = await gateway_for([upstream], redis_url=redis_server.url)
    second = await gateway_for([upstream], redis_url=redis_server.url)
    await first.admin.put("/admin/prices/smollm2", json={"input": 1.0, "output": 2.0})
    prompt, max_tokens = "count to five", 5
    max_cost = estimate_prompt_tokens({"prompt": prompt}, image_tokens=0) * 1 + max_tokens * 2  # micro-units
    budget = {"amount": str(Decimal(25 * max_cost) / 10**6), "window": "day"}
    key_id, secret = await first.key(quota={"budget": budget})
    clients = [first.client(secret), second.client(secret)]
    answers = await asyncio.gather(*(clients[n % 2].completions.create(model="smollm2", prompt=prompt,
                                                                        max_tokens=max_tokens)
                                     for n in range(40)), return_exceptions=True)
    served = [a for a in answers if not isinstance(a, BaseException)]
    refused = [a for a in answers if isinstance(a, openai.RateLimitError)]
    assert (len(served), len(refused)) == (25, 15)
    assert {r.code for r in refused} == {"insufficient_quota"}
    usage = await second.usage(key_id=key_id)
    expected = sum(Decimal(a.usage.prompt_tokens * 1 + a.usage.completion_tokens * 2) for a in served if a.usage)
    assert Decimal(str(usage["cost"])) * 10**6 == expected <= 25 * max_cost


async def test_prompt_tokens_the_real_backend_served_from_its_cache_are_charged_at_the_cached_price(
        backend_gateway: GatewayHarness) -> None:
    gateway = backend_gateway
    await gateway.admin.put("/admin/prices/smollm2", json={"input": 1.0, "cached_input": 0.0, "output": 0.0})
    key_id, secret = await gateway.key()
    prompt = "The quick brown fox jumps over the lazy dog. " * 8  # several full KV blocks
    for _ in range(2):
        await gateway.client(secret, timeout=120).completions.create(model="smollm2", prompt=prompt, max_tokens=1)
    usage = await gateway.usage(key_id=key_id)
    cached = sum(row["cached_tokens"] for row in usage["rows"])
    assert cached >= 16  # the second request's prefix came from the backend's prefix cache
    assert Decimal(str(usage["cost"])) == Decimal(usage["prompt_tokens"] - cached) / 10**6
