"""Token buckets per tenant level on every store: burst at once, then the rate; refusals named; refunds."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from config.stores import StoreSettings
from quota import InvalidRequest, Level, LimitName, Quota, QuotaService, open_store
from tests.quota.conftest import make_tenant, store_settings
from tests.servers import RedisServer


async def admit_all(service: QuotaService, keys: list, count: int, estimate: int = 10, tag: str = "r") -> list:
    return list(await asyncio.gather(*(
        service.admit(keys[n % len(keys)], model="m", estimated_tokens=estimate, request_id=f"{tag}{n}")
        for n in range(count))))


async def test_request_bucket_admits_its_burst_at_once_and_names_itself(service: QuotaService) -> None:
    tenant = await make_tenant(service, key={"request_bucket": {"rate": 2, "burst": 10}, "rpm": 1000})
    started = time.monotonic()
    answers = await admit_all(service, tenant.keys, 100)
    elapsed = time.monotonic() - started
    admitted = sum(a.admitted for a in answers)
    assert 10 <= admitted <= 10 + int(2 * elapsed)
    refused = [a for a in answers if not a.admitted]
    assert {(a.refused_level, a.refused_limit) for a in refused} == {(Level.key, LimitName.request_bucket)}
    assert all(0 < a.retry_after <= 0.5 for a in refused)
    # a refusal takes nothing: the rpm window counts only what was admitted (and would count this one)
    assert refused[-1].rate.remaining_requests == 1000 - admitted - 1


async def test_token_bucket_refuses_until_refilled_and_settlement_refunds(service: QuotaService) -> None:
    tenant = await make_tenant(service, account={"token_bucket": {"rate": 10, "burst": 1000}}, with_sub=True)
    first = await service.admit(tenant.keys[0], model="m", estimated_tokens=800, request_id="a")
    assert first.admitted and first.reservation is not None
    refused = await service.admit(tenant.keys[0], model="m", estimated_tokens=300, request_id="b")
    assert (refused.refused_level, refused.refused_limit) == (Level.account, LimitName.token_bucket)
    assert refused.retry_after == pytest.approx(10.0, abs=0.5)  # 100 tokens missing at 10 per second
    await service.settle(first.reservation, prompt_tokens=60, completion_tokens=40, model="m")
    again = await service.admit(tenant.keys[0], model="m", estimated_tokens=300, request_id="c")
    assert again.admitted  # 700 of the 800 came back


async def test_a_request_above_the_burst_passes_a_full_bucket_then_waits_for_the_debt(
        service: QuotaService) -> None:
    tenant = await make_tenant(service, key={"token_bucket": {"rate": 100, "burst": 50}})
    big = await service.admit(tenant.keys[0], model="m", estimated_tokens=250, request_id="a")
    assert big.admitted
    after = await service.admit(tenant.keys[0], model="m", estimated_tokens=10, request_id="b")
    assert not after.admitted and after.retry_after == pytest.approx(2.1, abs=0.2)


@pytest.mark.parametrize("bad", [{"rate": 0, "burst": 1}, {"rate": 1, "burst": 0}, {"rate": 1}, {"rate": "1", "burst": 2},
                                 {"rate": 1, "burst": 1.5}, {"rate": True, "burst": 2}, [1, 2], 5])
def test_a_bad_bucket_is_refused_naming_the_field(bad: object) -> None:
    with pytest.raises(InvalidRequest, match="request_bucket"):
        Quota.from_dict({"request_bucket": bad})


async def test_bucket_settings_round_trip_and_clear(service: QuotaService) -> None:
    tenant = await make_tenant(service, key={"token_bucket": {"rate": 2.5, "burst": 7}})
    key = await service.admin.get_key(tenant.keys[0].id)
    assert key.quota.to_dict() == {"token_bucket": {"rate": 2.5, "burst": 7}}
    await service.admin.update_key(key.id, quota={"rpm": 5})
    answers = await admit_all(service, tenant.keys, 3, estimate=100, tag="x")
    assert all(a.admitted for a in answers)  # the bucket is gone, every level unlimited in tokens


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_two_services_sharing_redis_hold_burst_then_rate(settings: StoreSettings,
                                                               service: QuotaService) -> None:
    """Two admission services (as two gateway replicas) on one Redis: 10 at once, then about 2 per second."""
    other = await open_store(settings)
    try:
        tenant = await make_tenant(service, key={"request_bucket": {"rate": 2, "burst": 10}})
        replicas = [service, other]
        started = time.monotonic()
        first = await asyncio.gather(*(replicas[n % 2].admit(tenant.keys[0], model="m", estimated_tokens=1,
                                                             request_id=f"b{n}") for n in range(100)))
        burst = sum(a.admitted for a in first)
        assert 10 <= burst <= 10 + int(2 * (time.monotonic() - started))
        admitted = burst
        n = 0
        while time.monotonic() - started < 3.0:
            n += 1
            answers = await asyncio.gather(*(r.admit(tenant.keys[0], model="m", estimated_tokens=1,
                                                     request_id=f"p{n}-{i}") for i, r in enumerate(replicas)))
            admitted += sum(a.admitted for a in answers)
            await asyncio.sleep(0.05)
        elapsed = time.monotonic() - started
        assert admitted <= 10 + 2 * elapsed + 1  # never more than burst + rate x time, across both
        assert admitted >= 10 + 2 * (elapsed - 0.5) - 1
    finally:
        await other.close()


async def test_with_redis_down_each_replica_keeps_its_share_of_a_bucket(redis_server: RedisServer,
                                                                       tmp_path: Path) -> None:
    service = await open_store(store_settings("redis", tmp_path, redis_server, gateway_replicas=2,
                                              redis_retry_interval=60.0))
    tenant = await make_tenant(service, key={"request_bucket": {"rate": 0.001, "burst": 10},
                                             "token_bucket": {"rate": 0.001, "burst": 1000}})
    assert (await service.admit(tenant.keys[0], model="m", estimated_tokens=1, request_id="seen")).admitted
    redis_server.kill()
    answers = [await service.admit(tenant.keys[0], model="m", estimated_tokens=1, request_id=f"d{n}")
               for n in range(20)]
    assert sum(a.admitted for a in answers) == 5 and all(a.degraded for a in answers)
    assert {a.refused_limit for a in answers if not a.admitted} == {LimitName.request_bucket}
    await service.close()
