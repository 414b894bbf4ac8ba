"""Admission on every store: exact limits under concurrency, refusals that charge nothing, settlement."""

from __future__ import annotations

import asyncio
import random
import time
from datetime import UTC, datetime

import pytest

from quota import Level, LimitName, QuotaService
from tests.quota.conftest import make_tenant
from tests.waiting import wait_until_async


async def admit_many(service: QuotaService, keys: list, count: int, estimate: int | list[int] = 10) -> list:
    estimates = estimate if isinstance(estimate, list) else [estimate] * count
    return list(await asyncio.gather(*(
        service.admit(keys[n % len(keys)], model="m", estimated_tokens=estimates[n], request_id=f"r{n}")
        for n in range(count))))


async def test_rpm_admits_exactly_the_limit_among_2000_concurrent_admissions(service: QuotaService) -> None:
    tenant = await make_tenant(service, key={"rpm": 100})
    answers = await admit_many(service, tenant.keys, 2000)
    assert sum(a.admitted for a in answers) == 100
    refused = [a for a in answers if not a.admitted]
    assert all(a.refused_level == Level.key and a.refused_limit == LimitName.rpm for a in refused)
    assert all(0 < a.retry_after <= 60 for a in refused)


async def test_tpm_admitted_estimates_never_sum_above_the_limit(service: QuotaService) -> None:
    tenant = await make_tenant(service, key={"tpm": 10_000})
    rng = random.Random(7)
    estimates = [rng.randint(1, 700) for _ in range(1000)]
    answers = await admit_many(service, tenant.keys, 1000, estimates)
    admitted = sum(e for e, a in zip(estimates, answers, strict=True) if a.admitted)
    assert 10_000 - 700 < admitted <= 10_000


async def test_sub_account_and_account_caps_hold_over_several_keys(service: QuotaService) -> None:
    tenant = await make_tenant(service, keys=5, account={"rpm": 1000}, sub={"rpm": 37}, key={"rpm": 10})
    answers = await admit_many(service, tenant.keys, 500)
    assert sum(a.admitted for a in answers) == 37
    assert {a.refused_level for a in answers if not a.admitted} <= {Level.key, Level.sub_account}

    other = await make_tenant(service, keys=4, account={"tpm": 1_000})
    answers = await admit_many(service, other.keys, 400, 7)
    assert sum(a.admitted for a in answers) == 1_000 // 7
    assert {a.refused_level for a in answers if not a.admitted} == {Level.account}


async def test_a_refusal_charges_no_level(service: QuotaService) -> None:
    tenant = await make_tenant(service, account={"rpm": 3}, key={"rpm": 5, "tpm": 1000})
    answers = await admit_many(service, tenant.keys, 10, 50)
    assert sum(a.admitted for a in answers) == 3
    assert answers[-1].refused_level == Level.account
    await service.admin.update_account(tenant.account_id, quota={"rpm": 100})
    answers = await admit_many(service, tenant.keys, 10, 50)
    # The key's window holds only the 3 admitted requests and their 150 tokens.
    assert sum(a.admitted for a in answers) == 2


async def test_settlement_refunds_the_unused_estimate(service: QuotaService) -> None:
    tenant = await make_tenant(service, key={"tpm": 1000, "tokens_per_day": 1500})
    first = await service.admit(tenant.keys[0], model="m", estimated_tokens=1000, request_id="a")
    assert first.admitted and first.reservation is not None
    refused = await service.admit(tenant.keys[0], model="m", estimated_tokens=100, request_id="b")
    assert not refused.admitted and refused.refused_limit == LimitName.tpm
    await service.settle(first.reservation, prompt_tokens=40, completion_tokens=60, model="m")
    second = await service.admit(tenant.keys[0], model="m", estimated_tokens=900, request_id="c")
    assert second.admitted and second.rate.remaining_tokens == 0
    over_budget = await service.admit(tenant.keys[0], model="m", estimated_tokens=0, request_id="d")
    assert over_budget.admitted  # 100 + 900 of 1500 used today; tokens window is full but a 0 cost fits


async def test_double_settlement_is_a_no_op(service: QuotaService) -> None:
    tenant = await make_tenant(service, key={"tpm": 1000, "max_concurrency": 1})
    answer = await service.admit(tenant.keys[0], model="m", estimated_tokens=500, request_id="a")
    assert answer.reservation is not None
    for _ in range(3):  # a retried upstream call settles the same reservation again
        await service.settle(answer.reservation, prompt_tokens=100, completion_tokens=100, model="m")
    usage = await service.admin.usage(key_id=tenant.keys[0].id)
    assert (usage.prompt_tokens, usage.completion_tokens, usage.requests) == (100, 100, 1)
    fits = await service.admit(tenant.keys[0], model="m", estimated_tokens=800, request_id="b")
    assert fits.admitted  # refunded 300 exactly once: 200 + 800
    assert not (await service.admit(tenant.keys[0], model="m", estimated_tokens=0, request_id="c")).admitted


async def test_concurrency_slot_is_freed_by_settlement(service: QuotaService) -> None:
    tenant = await make_tenant(service, sub={"max_concurrency": 2}, keys=3)
    answers = await admit_many(service, tenant.keys, 6)
    held = [a for a in answers if a.admitted]
    assert len(held) == 2
    assert all(a.refused_limit == LimitName.concurrency and a.refused_level == Level.sub_account
               for a in answers if not a.admitted)
    await service.settle(held[0].reservation, prompt_tokens=1, completion_tokens=1, model="m")
    assert sum(a.admitted for a in await admit_many(service, tenant.keys, 3)) == 1


async def test_lease_expiry_frees_a_leaked_slot_and_renew_keeps_it(service: QuotaService) -> None:
    tenant = await make_tenant(service, key={"max_concurrency": 1})
    kept = await make_tenant(service, key={"max_concurrency": 1})
    leaked = await service.admit(tenant.keys[0], model="m", estimated_tokens=1, request_id="lost")
    alive = await service.admit(kept.keys[0], model="m", estimated_tokens=1, request_id="alive")
    assert leaked.admitted and alive.admitted and alive.reservation is not None

    async def renewing_until_the_leak_lapses() -> bool:  # lease_ttl is 0.6 s in these fixtures
        await service.renew(alive.reservation)
        return (await service.admit(tenant.keys[0], model="m", estimated_tokens=1, request_id="next")).admitted

    await wait_until_async(renewing_until_the_leak_lapses, what="the leaked lease lapsed", interval=0.1)
    blocked = await service.admit(kept.keys[0], model="m", estimated_tokens=1, request_id="blocked")
    assert not blocked.admitted and blocked.refused_limit == LimitName.concurrency


async def test_daily_budget_refuses_until_midnight(service: QuotaService) -> None:
    tenant = await make_tenant(service, account={"tokens_per_day": 100, "tokens_per_month": 10_000})
    assert (await service.admit(tenant.keys[0], model="m", estimated_tokens=100, request_id="a")).admitted
    refused = await service.admit(tenant.keys[0], model="m", estimated_tokens=1, request_id="b")
    assert not refused.admitted and refused.refused_limit == LimitName.tokens_per_day
    assert refused.refused_level == Level.account
    until_midnight = 86400 - time.time() % 86400
    assert refused.retry_after is not None and abs(refused.retry_after - until_midnight) < 5


async def test_rate_info_reports_the_tightest_level(service: QuotaService) -> None:
    tenant = await make_tenant(service, account={"rpm": 50, "tpm": 5000}, key={"rpm": 10, "tpm": 90_000})
    answer = await service.admit(tenant.keys[0], model="m", estimated_tokens=100, request_id="a")
    rate = answer.rate
    assert (rate.limit_requests, rate.remaining_requests) == (10, 9)
    assert (rate.limit_tokens, rate.remaining_tokens) == (5000, 4900)
    assert rate.reset_requests is not None and 0 < rate.reset_requests <= 60


async def test_unlimited_key_is_always_admitted_and_reports_no_rate(service: QuotaService) -> None:
    tenant = await make_tenant(service)
    answers = await admit_many(service, tenant.keys, 200)
    assert all(a.admitted and a.rate.limit_requests is None for a in answers)


async def test_negative_or_non_integer_token_counts_are_refused(service: QuotaService) -> None:
    tenant = await make_tenant(service, key={"tpm": 100})
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="estimated_tokens"):
            await service.admit(tenant.keys[0], model="m", estimated_tokens=bad, request_id="x")  # type: ignore[arg-type]
    answer = await service.admit(tenant.keys[0], model="m", estimated_tokens=100, request_id="ok")
    assert answer.reservation is not None
    with pytest.raises(ValueError, match="completion_tokens"):
        await service.settle(answer.reservation, prompt_tokens=1, completion_tokens=-500, model="m")
    assert not (await service.admit(tenant.keys[0], model="m", estimated_tokens=1, request_id="y")).admitted


async def test_concurrent_settlements_of_one_reservation_charge_once(service: QuotaService) -> None:
    tenant = await make_tenant(service, key={"tpm": 1000})
    answer = await service.admit(tenant.keys[0], model="m", estimated_tokens=600, request_id="a")
    assert answer.reservation is not None
    await asyncio.gather(*(service.settle(answer.reservation, prompt_tokens=100, completion_tokens=50,
                                          model="m") for _ in range(20)))
    usage = await service.admin.usage(key_id=tenant.keys[0].id)
    assert (usage.requests, usage.prompt_tokens, usage.completion_tokens) == (1, 100, 50)
    assert (await service.admit(tenant.keys[0], model="m", estimated_tokens=850, request_id="b")).admitted
    assert not (await service.admit(tenant.keys[0], model="m", estimated_tokens=1, request_id="c")).admitted


async def test_monthly_budget_refuses_until_the_next_month(service: QuotaService) -> None:
    tenant = await make_tenant(service, with_sub=True, sub={"tokens_per_month": 300})
    assert (await service.admit(tenant.keys[0], model="m", estimated_tokens=300, request_id="a")).admitted
    refused = await service.admit(tenant.keys[0], model="m", estimated_tokens=1, request_id="b")
    assert not refused.admitted and refused.refused_level == Level.sub_account
    assert refused.refused_limit == LimitName.tokens_per_month
    now = datetime.now(UTC)
    next_month = datetime(now.year + now.month // 12, now.month % 12 + 1, 1, tzinfo=UTC)
    assert refused.retry_after is not None and abs(refused.retry_after - (next_month - now).total_seconds()) < 5
