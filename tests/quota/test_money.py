"""Money in admission: budgets reserved at the maximum cost across replicas, costs at the price in force at
admission, prepaid balances, and calendar windows in the account's time zone (a fake clock, no sleeps)."""

from __future__ import annotations

import asyncio
import itertools
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest
import redis
import redis.asyncio

from config.stores import OnRedisDown, RedisDownPolicy
from quota import Admission, KeyInfo, Level, LimitName, QuotaService, open_store
from quota.records import UsageRow
from quota.rules.unit_cost import unit_costs, unit_costs_by_model
from quota.stores.embedded.store import EmbeddedQuotaService
from quota.stores.redis.store import RedisQuotaService
from tests.quota.conftest import make_durable, make_tenant, restart_durable, store_settings
from tests.servers import RedisServer
from tests.waiting import wait_until_async

PRICE = {"input": 2.0, "cached_input": 0.5, "output": 4.0}  # currency units per million tokens
NEW_PRICE = {"input": 3.0, "cached_input": 1.0, "output": 6.0}
PROMPT, MAX_OUT = 100, 50
MAX_COST = Decimal(PROMPT * 2 + MAX_OUT * 4) / 10**6  # 0.0004 at PRICE
ids = itertools.count()


async def admit(service: QuotaService, key: KeyInfo) -> Admission:
    return await service.admit(key, model="smollm2", estimated_tokens=PROMPT + MAX_OUT,
                               request_id=f"req-{next(ids)}", max_output_tokens=MAX_OUT)


def cost_of(price: dict[str, float], prompt: int, cached: int, completion: int) -> Decimal:
    """usage x price, in currency units, computed here independently of quota/."""
    per_million = ((prompt - cached) * Decimal(str(price["input"])) + cached * Decimal(str(price["cached_input"]))
                   + completion * Decimal(str(price["output"])))
    return per_million / 10**6


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_forty_concurrent_requests_through_two_admission_services_never_overspend(
        service: QuotaService, tmp_path: Path, redis_server: RedisServer) -> None:
    second = await open_store(store_settings("redis", tmp_path, redis_server))
    try:
        await service.money.set_price("smollm2", PRICE)
        tenant = await make_tenant(service, key={"budget": {"amount": str(25 * MAX_COST), "window": "month"}})
        key = tenant.keys[0]
        replicas = itertools.cycle([service, second])
        answers = await asyncio.gather(*(admit(next(replicas), key) for _ in range(40)))
        admitted = [a.reservation for a in answers if a.admitted and a.reservation is not None]
        assert len(admitted) == 25
        assert {(a.refused_level, a.refused_limit) for a in answers if not a.admitted} == {
            (Level.key, LimitName.budget)}
        expected = Decimal(0)
        for n, reservation in enumerate(admitted):
            cached, completion = 2 * (n % 4), 10 + n
            await next(replicas).settle(reservation, prompt_tokens=90, completion_tokens=completion,
                                        cached_tokens=cached, model="smollm2", channel="c0")
            expected += cost_of(PRICE, 90, cached, completion)
        report = await service.admin.usage(key_id=key.id)
        assert Decimal(report.cost) / 10**6 == expected <= 25 * MAX_COST
        assert (report.requests, report.completion_tokens) == (25, sum(10 + n for n in range(25)))
        # settling refunded what was reserved beyond the real cost: room for more requests again
        assert (await admit(second, key)).admitted
    finally:
        await second.close()


async def test_a_price_change_mid_run_keeps_the_old_price_for_requests_admitted_before_it(
        tmp_path: Path, redis_server: RedisServer) -> None:
    service = await open_store(store_settings("redis", tmp_path, redis_server, auth_cache_ttl=0.0))
    try:
        await service.money.set_price("smollm2", PRICE)
        key = (await make_tenant(service)).keys[0]
        before = [await admit(service, key) for _ in range(3)]
        await service.money.set_price("smollm2", NEW_PRICE)
        after = [await admit(service, key) for _ in range(2)]
        for answer in before + after:  # all settled after the change
            assert answer.reservation is not None
            await service.settle(answer.reservation, prompt_tokens=80, completion_tokens=20, model="smollm2")
        report = await service.admin.usage(key_id=key.id)
        expected = 3 * cost_of(PRICE, 80, 0, 20) + 2 * cost_of(NEW_PRICE, 80, 0, 20)
        assert Decimal(report.cost) / 10**6 == expected
        assert [p.effective_from for p in await service.money.prices()] == sorted(
            p.effective_from for p in await service.money.prices())
    finally:
        await service.close()


async def test_a_prepaid_balance_refuses_what_it_cannot_cover_and_pays_for_what_was_served(
        service: QuotaService) -> None:
    await service.money.set_price("smollm2", PRICE)
    tenant = await make_tenant(service, with_sub=True)
    key = tenant.keys[0]
    await service.money.top_up(tenant.account_id, {"amount": 0.001, "note": "first top-up"})
    first, second, third = [await admit(service, key) for _ in range(3)]
    assert first.admitted and second.admitted  # 0.0008 reserved of 0.001
    assert (third.admitted, third.refused_level, third.refused_limit) == (False, Level.account, LimitName.balance)
    assert first.reservation is not None
    await service.settle(first.reservation, prompt_tokens=100, completion_tokens=25, model="smollm2")
    balance, journal = await service.money.balance(tenant.account_id)
    assert balance == 1000 - 300 - 400  # micro-units: the top-up, the first request's cost, the second's hold
    await service.money.top_up(tenant.account_id, {"amount": -0.0001, "note": "correction"})
    balance, journal = await service.money.balance(tenant.account_id)
    assert balance == 200 and [(e.amount, e.note) for e in journal] == [(1000, "first top-up"), (-100, "correction")]


async def test_a_daily_budget_renews_at_midnight_in_the_accounts_time_zone(tmp_path: Path) -> None:
    now = [datetime(2026, 3, 1, 15, 59, 58, tzinfo=UTC).timestamp()]  # 23:59:58 in Shanghai (UTC+8)
    service = EmbeddedQuotaService(store_settings("embedded", tmp_path, None), clock=lambda: now[0])
    try:
        await service.money.set_price("smollm2", PRICE)
        tenant = await make_tenant(service, account={"budget": {"amount": str(MAX_COST), "window": "day"}})
        await service.admin.update_account(tenant.account_id, timezone="Asia/Shanghai")
        key = tenant.keys[0]
        assert (await admit(service, key)).admitted
        refused = await admit(service, key)
        assert (refused.refused_level, refused.refused_limit) == (Level.account, LimitName.budget)
        assert refused.retry_after == pytest.approx(2.0)  # until midnight in Shanghai, not in UTC
        now[0] += 2  # 00:00:00 in Shanghai, 16:00 UTC
        assert (await admit(service, key)).admitted
        now[0] += 8 * 3600 - 1  # 23:59:59 UTC: still the same Shanghai day, nothing renews
        assert not (await admit(service, key)).admitted
    finally:
        await service.close()


async def test_the_embedded_store_keeps_spend_and_balances_across_a_restart(tmp_path: Path) -> None:
    settings = store_settings("embedded", tmp_path, None)
    service = EmbeddedQuotaService(settings)
    await service.money.set_price("smollm2", PRICE)
    tenant = await make_tenant(service, key={"budget": {"amount": str(2 * MAX_COST), "window": "total"}})
    await service.money.top_up(tenant.account_id, {"amount": 1})
    answer = await admit(service, tenant.keys[0])
    assert answer.reservation is not None
    await service.settle(answer.reservation, prompt_tokens=PROMPT, completion_tokens=MAX_OUT, model="smollm2")
    await service.close()
    service = EmbeddedQuotaService(settings)
    try:
        assert (await admit(service, tenant.keys[0])).admitted  # the second of two that fit
        assert (await admit(service, tenant.keys[0])).refused_limit is LimitName.budget
        balance, _ = await service.money.balance(tenant.account_id)
        assert balance == 10**6 - 2 * 400
    finally:
        await service.close()


async def test_each_settled_request_leaves_a_compact_audit_record_without_content(service: QuotaService) -> None:
    await service.money.set_price("smollm2", PRICE)
    tenant = await make_tenant(service)
    answers = [await admit(service, tenant.keys[0]) for _ in range(3)]
    for n, answer in enumerate(answers):
        assert answer.reservation is not None
        await service.settle(answer.reservation, prompt_tokens=40, completion_tokens=n, cached_tokens=8,
                             model="smollm2", channel="c0", outcome="cut" if n == 2 else "ok")
    day = answers[0].reservation.day if answers[0].reservation else 0
    records = await service.money.requests(tenant.account_id, day, 10)
    assert [(r.request_id, r.completion_tokens, r.outcome) for r in records] == [
        (a.reservation.request_id, n, "cut" if n == 2 else "ok") for n, a in enumerate(answers) if a.reservation]
    assert records[2].cost == 32 * 2 + 8 // 2 + 2 * 4 and records[2].channel == "c0"
    assert all(len(r.encode()) < 100 for r in records)  # ids, counts and the outcome: never a prompt


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_a_day_of_audit_records_costs_under_100_bytes_per_request_in_redis(
        service: QuotaService, redis_server: RedisServer) -> None:
    tenant = await make_tenant(service)
    for _ in range(1000):
        answer = await admit(service, tenant.keys[0])
        assert answer.reservation is not None
        await service.settle(answer.reservation, prompt_tokens=1834, completion_tokens=412, cached_tokens=1024,
                             model="smollm2", channel="local-1")
    client = redis.Redis.from_url(redis_server.url)
    lists = client.keys("*:requests:*")
    assert len(lists) == 1 and client.llen(lists[0]) == 1000
    assert client.memory_usage(lists[0]) / 1000 < 100
    assert 0 < client.ttl(lists[0]) <= 31 * 86400  # kept for the retention (30 days by default), then gone


# a test's own clock for the Redis scripts, read from a key the test sets (Redis TIME cannot be moved)
FAKE_SERVER_TIME = """
local function server_time()
  local ms = tonumber(redis.call('GET', 'test:now_ms'))
  return math.floor(ms / 1000), ms
end
"""


async def test_a_weekly_budget_renews_on_monday_in_los_angeles_with_the_store_clock(
        tmp_path: Path, redis_server: RedisServer) -> None:
    now = [datetime(2026, 3, 2, 7, 59, 58, tzinfo=UTC).timestamp()]  # Sunday 23:59:58 in Los Angeles (UTC-8)
    settings = store_settings("redis", tmp_path, redis_server)
    client = redis.asyncio.Redis.from_url(redis_server.url, decode_responses=True)
    service = RedisQuotaService(settings, client, clock=lambda: now[0], clock_lua=FAKE_SERVER_TIME)

    async def admit_at(moment: float) -> Admission:
        now[0] = moment
        await client.set("test:now_ms", int(moment * 1000))
        return await admit(service, tenant.keys[0])

    try:
        await service.money.set_price("smollm2", PRICE)
        tenant = await make_tenant(service, sub={"budget": {"amount": str(MAX_COST), "window": "week"}})
        await service.admin.update_account(tenant.account_id, timezone="America/Los_Angeles")
        assert (await admit_at(now[0])).admitted
        refused = await admit_at(now[0] + 1)
        assert (refused.refused_level, refused.refused_limit) == (Level.sub_account, LimitName.budget)
        assert refused.retry_after == pytest.approx(1.0)  # Monday 00:00 in Los Angeles, 08:00 UTC
        assert (await admit_at(now[0] + 1)).admitted
        assert not (await admit_at(now[0] + 6 * 86400)).admitted  # Sunday 00:00 there: the same week
    finally:
        await service.close()


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_budgets_and_balances_fail_closed_while_redis_is_down(service: QuotaService,
                                                                   redis_server: RedisServer) -> None:
    await service.money.set_price("smollm2", PRICE)
    budget = await make_tenant(service, key={"budget": {"amount": 1, "window": "day"}})
    prepaid = await make_tenant(service)
    await service.money.top_up(prepaid.account_id, {"amount": 1})
    for tenant in (budget, prepaid):
        assert (await admit(service, tenant.keys[0])).admitted
    redis_server.kill()
    for tenant in (budget, prepaid):
        answer = await admit(service, tenant.keys[0])
        assert (answer.admitted, answer.unavailable, answer.degraded) == (False, True, True)


def test_unit_cost_is_a_days_running_cost_over_the_tokens_served() -> None:
    day = datetime(2026, 3, 2, tzinfo=UTC)
    rows = [UsageRow(day, "a", None, "k", "smollm2", 150_000_000, 30_000_000, 9, channel="own-gpu"),
            UsageRow(day, "a", None, "k", "smollm2", 5, 5, 1, channel="cloud")]
    costs = unit_costs(rows, {"own-gpu": 2.40, "cloud": 0.0}, now=day.timestamp() + 3 * 86400)
    assert costs == [{"day": "2026-03-02", "channel": "own-gpu", "tokens": 180_000_000, "hours": 24.0,
                      "running_cost": 57.6, "cost_per_million_tokens": 0.32}]


def test_unit_cost_per_model_splits_each_channels_running_cost_by_token_share() -> None:
    day = datetime(2026, 3, 2, tzinfo=UTC)
    rows = [UsageRow(day, "a", None, "k", "smollm2", 100_000_000, 20_000_000, 9, channel="own-gpu"),
            UsageRow(day, "a", None, "k", "qwen", 50_000_000, 10_000_000, 5, channel="own-gpu"),
            UsageRow(day, "a", None, "k", "qwen", 30_000_000, 10_000_000, 4, channel="own-cpu"),
            UsageRow(day, "a", None, "k", "gpt", 5, 5, 1, channel="cloud")]
    costs = unit_costs_by_model(rows, {"own-gpu": 2.40, "own-cpu": 0.50, "cloud": 0.0},
                                now=day.timestamp() + 3 * 86400)
    # own-gpu: 57.60 over 180M tokens (120M smollm2, 60M qwen); own-cpu: 12.00 over 40M, all qwen
    assert costs == [{"day": "2026-03-02", "model": "qwen", "tokens": 100_000_000, "running_cost": 31.2,
                      "cost_per_million_tokens": 0.312},
                     {"day": "2026-03-02", "model": "smollm2", "tokens": 120_000_000, "running_cost": 38.4,
                      "cost_per_million_tokens": 0.32}]


async def test_a_local_budget_policy_prices_requests_from_what_it_last_read_while_redis_is_down(
        tmp_path: Path, redis_server: RedisServer) -> None:
    policy = RedisDownPolicy(budgets=OnRedisDown.local)
    service = await open_store(store_settings("redis", tmp_path, redis_server, redis_down=policy,
                                              gateway_replicas=2))
    try:
        await service.money.set_price("smollm2", PRICE)
        tenant = await make_tenant(service, key={"budget": {"amount": str(4 * MAX_COST), "window": "day"}})
        assert (await admit(service, tenant.keys[0])).admitted
        redis_server.kill()
        answers = [await admit(service, tenant.keys[0]) for _ in range(3)]
        assert [a.admitted for a in answers] == [True, True, False]  # half the budget on each of two replicas
        assert answers[2].refused_limit is LimitName.budget and all(a.degraded for a in answers)
    finally:
        await service.close()


async def test_a_fail_open_balance_still_pays_for_requests_served_while_redis_was_down(
        tmp_path: Path, redis_server: RedisServer) -> None:
    make_durable(redis_server)
    policy = RedisDownPolicy(budgets=OnRedisDown.fail_open)
    service = await open_store(store_settings("redis", tmp_path, redis_server, redis_down=policy,
                                              redis_retry_interval=0.1))
    try:
        await service.money.set_price("smollm2", PRICE)
        tenant = await make_tenant(service)
        await service.money.top_up(tenant.account_id, {"amount": 1})
        before = await admit(service, tenant.keys[0])
        redis_server.kill()
        during = await admit(service, tenant.keys[0])
        assert during.admitted and during.degraded and during.reservation is not None
        await service.settle(during.reservation, prompt_tokens=100, completion_tokens=10, model="smollm2")
        restart_durable(redis_server)
        async def flushed() -> bool:
            return await service.flush_pending() == 0  # type: ignore[attr-defined]

        await wait_until_async(flushed, timeout=30, what="the outage's settlement written to Redis")
        balance, _ = await service.money.balance(tenant.account_id)
        assert balance == 10**6 - 400 - (100 * 2 + 10 * 4)  # the first request's hold, the second's cost
        assert before.admitted
    finally:
        await service.close()
