"""Tenancy through the admin API on every store: keys, revocation, expiry, models, quotas, usage."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest

from quota import InvalidRequest, NotFound, QuotaService
from tests.quota.conftest import make_tenant


async def test_key_secret_is_prefixed_and_authenticates(service: QuotaService) -> None:
    account = await service.admin.create_account("acme")
    created = await service.admin.create_key(account_id=account.id, name="ci", models=["smollm2"],
                                             priority_class="batch")
    assert created.secret.startswith("tg-") and len(created.secret) > 40
    auth = await service.authenticate(created.secret)
    assert auth.ok and auth.key is not None
    assert (auth.key.id, auth.key.account_id, auth.key.priority_class) == (created.key.id, account.id, "batch")
    assert auth.key.allows("smollm2") and not auth.key.allows("gpt-4")
    listed = await service.admin.list_keys(account_id=account.id)
    assert [k.id for k in listed] == [created.key.id]
    assert created.secret not in repr(listed)


async def test_unknown_secret_is_refused(service: QuotaService) -> None:
    auth = await service.authenticate("tg-not-a-key")
    assert not auth.ok and auth.reason == "unknown" and auth.key is None


async def test_revocation_is_visible_within_one_second(service: QuotaService) -> None:
    tenant = await make_tenant(service)
    await service.admin.revoke_key(tenant.keys[0].id)
    await asyncio.sleep(1.05)
    auth = await service.authenticate(tenant.secrets[0])
    assert not auth.ok and auth.reason == "revoked"


async def test_expired_key_is_refused(service: QuotaService) -> None:
    account = await service.admin.create_account("acme")
    soon = datetime.now(UTC) + timedelta(seconds=1.0)
    created = await service.admin.create_key(account_id=account.id, expires_at=soon.isoformat())
    assert (await service.authenticate(created.secret)).ok
    await asyncio.sleep(1.05)
    auth = await service.authenticate(created.secret)
    assert not auth.ok and auth.reason == "expired"


async def test_bad_admin_input_is_refused_with_the_field_named(service: QuotaService) -> None:
    account = await service.admin.create_account("acme")
    with pytest.raises(InvalidRequest, match=r"quota\.rpm"):
        await service.admin.create_account("x", {"rpm": -1})
    with pytest.raises(InvalidRequest, match="unknown quota fields: burst"):
        await service.admin.update_account(account.id, quota={"burst": 3})
    with pytest.raises(InvalidRequest, match="expires_at"):
        await service.admin.create_key(account_id=account.id, expires_at="tomorrow")
    with pytest.raises(InvalidRequest, match="models"):
        await service.admin.create_key(account_id=account.id, models="smollm2")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequest):
        await service.admin.create_key()
    with pytest.raises(NotFound):
        await service.admin.create_key(account_id="acct_missing")
    with pytest.raises(NotFound):
        await service.admin.revoke_key("key_missing")


async def test_sub_account_key_must_belong_to_the_named_account(service: QuotaService) -> None:
    first = await make_tenant(service, with_sub=True)
    second = await service.admin.create_account("other")
    with pytest.raises(InvalidRequest):
        await service.admin.create_key(account_id=second.id, sub_account_id=first.sub_account_id)
    subs = await service.admin.list_sub_accounts(first.account_id)
    assert [s.id for s in subs] == [first.sub_account_id]


async def test_quota_update_applies_to_the_next_admission(service: QuotaService) -> None:
    tenant = await make_tenant(service, key={"rpm": 1})
    key = tenant.keys[0]
    assert (await service.admit(key, model="m", estimated_tokens=1, request_id="a")).admitted
    assert not (await service.admit(key, model="m", estimated_tokens=1, request_id="b")).admitted
    updated = await service.admin.update_key(key.id, quota={"rpm": 3}, name="renamed")
    assert updated.quota.rpm == 3 and updated.name == "renamed"
    await asyncio.sleep(1.05)  # quota caches live at most as long as the auth cache
    assert (await service.admit(key, model="m", estimated_tokens=1, request_id="c")).admitted


async def test_usage_reads_by_key_model_and_time_range(service: QuotaService) -> None:
    tenant = await make_tenant(service, keys=2, with_sub=True)
    for n, (key, model) in enumerate([(0, "a"), (0, "b"), (1, "a"), (1, "a")]):
        answer = await service.admit(tenant.keys[key], model=model, estimated_tokens=50, request_id=f"r{n}")
        assert answer.reservation is not None
        await service.settle(answer.reservation, prompt_tokens=10 + n, completion_tokens=5, model=model)
    admin = service.admin
    total = await admin.usage(account_id=tenant.account_id)
    assert (total.prompt_tokens, total.completion_tokens, total.requests) == (46, 20, 4)
    assert (await admin.usage(sub_account_id=tenant.sub_account_id)).requests == 4
    by_key = await admin.usage(key_id=tenant.keys[1].id, model="a")
    assert (by_key.prompt_tokens, by_key.requests) == (25, 2)
    assert (await admin.usage(account_id=tenant.account_id, model="b")).prompt_tokens == 11
    now = datetime.now(UTC)
    hour = now.replace(minute=0, second=0, microsecond=0)
    assert (await admin.usage(start=hour, end=hour + timedelta(hours=1))).requests == 4
    assert (await admin.usage(start=hour + timedelta(hours=1))).requests == 0
    daily = await admin.usage(account_id=tenant.account_id, granularity="day")
    assert daily.requests == 4 and all(r.period_start.hour == 0 for r in daily.rows)
    with pytest.raises(InvalidRequest):
        await admin.usage(granularity="week")
