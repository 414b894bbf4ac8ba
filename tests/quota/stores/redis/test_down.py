"""Redis killed mid-run and restarted: each limit class follows its policy, nothing raises, nothing settled
is lost, and the store recovers by itself."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from config.stores import OnRedisDown, RedisDownPolicy, StoreSettings
from quota import QuotaService, open_store
from quota.stores.redis.store import RedisQuotaService
from tests.quota.conftest import make_durable, make_tenant, restart_durable
from tests.servers import RedisServer
from tests.waiting import wait_until_async


async def open_redis_store(server: RedisServer, tmp_path: Path, **policy: OnRedisDown) -> QuotaService:
    settings = StoreSettings(redis_url=server.url, data_dir=tmp_path, gateway_replicas=2,
                             redis_down=RedisDownPolicy(**policy), redis_retry_interval=0.2, lease_ttl=5.0,
                             redis_timeout=3.0)
    return await open_store(settings)


@pytest.fixture
async def durable(redis_server: RedisServer, tmp_path: Path) -> AsyncIterator[RedisServer]:
    make_durable(redis_server)
    yield redis_server


async def test_outage_follows_the_policy_per_limit_class_and_loses_no_settled_usage(
        durable: RedisServer, tmp_path: Path) -> None:
    service = await open_redis_store(durable, tmp_path)
    rate = await make_tenant(service, key={"rpm": 40})
    conc = await make_tenant(service, key={"max_concurrency": 4})
    budget = await make_tenant(service, account={"tokens_per_day": 10**6})
    open_before: list = []
    for tenant in (rate, conc, budget):  # one settled and one open request each, before the outage
        done = await service.admit(tenant.keys[0], model="m", estimated_tokens=10, request_id="before")
        await service.settle(done.reservation, prompt_tokens=5, completion_tokens=5, model="m")
        open_before.append(await service.admit(tenant.keys[0], model="m", estimated_tokens=10, request_id="open"))
    assert all(a.admitted and not a.degraded for a in open_before)

    durable.kill()
    await asyncio.sleep(1.05)  # past the auth cache
    auth = await service.authenticate(rate.secrets[0])
    assert not auth.ok and auth.reason == "store_unavailable"  # auth fails closed by default
    started = time.monotonic()
    rate_answers = [await service.admit(rate.keys[0], model="m", estimated_tokens=10, request_id=f"d{n}")
                    for n in range(100)]
    assert time.monotonic() - started < 5  # an outage costs a fallback, not a timeout per call
    assert all(a.degraded for a in rate_answers) and service.degraded
    assert sum(a.admitted for a in rate_answers) == 40 // 2  # local limit split over two replicas
    conc_answers = [await service.admit(conc.keys[0], model="m", estimated_tokens=10, request_id=f"c{n}")
                    for n in range(10)]
    assert sum(a.admitted for a in conc_answers) == 4 // 2
    budget_answer = await service.admit(budget.keys[0], model="m", estimated_tokens=10, request_id="b")
    assert budget_answer.unavailable and not budget_answer.admitted  # budgets fail closed
    for answer in open_before + [a for a in rate_answers if a.admitted]:
        await service.settle(answer.reservation, prompt_tokens=2, completion_tokens=1, model="m")
    await service.renew(conc_answers[0].reservation)  # nothing raises while down

    restart_durable(durable)
    await asyncio.sleep(0.25)  # past the retry interval (0.2 s): the next call tries Redis again
    recovered = await service.admit(budget.keys[0], model="m", estimated_tokens=10, request_id="after")
    assert recovered.admitted and not recovered.degraded and not service.degraded
    await wait_until_async(lambda: _no_pending(service), what="the outage's settlements replayed")
    usage = await service.admin.usage(account_id=rate.account_id)
    # 1 settled before, 1 open before and 20 local admissions settled during the outage.
    assert (usage.requests, usage.prompt_tokens, usage.completion_tokens) == (22, 5 + 21 * 2, 5 + 21)
    assert (await service.admin.usage(account_id=budget.account_id)).requests == 2
    assert (await service.authenticate(rate.secrets[0])).ok
    await service.close()


async def _no_pending(service: QuotaService) -> bool:
    assert isinstance(service, RedisQuotaService)
    return service.pending == 0


async def test_fail_open_and_fail_closed_rate_policies(redis_server: RedisServer, tmp_path: Path) -> None:
    open_service = await open_redis_store(redis_server, tmp_path, rate_limits=OnRedisDown.fail_open)
    closed_service = await open_redis_store(redis_server, tmp_path, rate_limits=OnRedisDown.fail_closed)
    tenant = await make_tenant(open_service, key={"rpm": 10})
    for svc in (open_service, closed_service):
        assert (await svc.admit(tenant.keys[0], model="m", estimated_tokens=1, request_id="seen")).admitted
    redis_server.kill()
    opened = [await open_service.admit(tenant.keys[0], model="m", estimated_tokens=1, request_id=f"o{n}")
              for n in range(50)]
    assert all(a.admitted and a.degraded for a in opened)
    closed = await closed_service.admit(tenant.keys[0], model="m", estimated_tokens=1, request_id="c")
    assert not closed.admitted and closed.unavailable and closed.degraded
    for svc in (open_service, closed_service):
        await svc.close()


async def test_auth_may_use_the_last_known_key_when_its_policy_allows(redis_server: RedisServer,
                                                                      tmp_path: Path) -> None:
    service = await open_redis_store(redis_server, tmp_path, auth=OnRedisDown.local)
    tenant = await make_tenant(service)
    unseen = await make_tenant(service, key={"rpm": 5})
    redis_server.kill()
    await asyncio.sleep(1.05)  # past the auth cache
    assert (await service.authenticate(tenant.secrets[0])).ok
    assert (await service.authenticate("tg-never-seen")).reason == "store_unavailable"
    # This key's quotas were never read from Redis: there is nothing safe to enforce locally.
    answer = await service.admit(unseen.keys[0], model="m", estimated_tokens=1, request_id="x")
    assert answer.unavailable and not answer.admitted
    await service.close()


async def test_settlements_alone_find_redis_back_and_replay_in_order(durable: RedisServer,
                                                                      tmp_path: Path) -> None:
    service = await open_redis_store(durable, tmp_path)
    tenant = await make_tenant(service, key={"max_concurrency": 10})
    answers = [await service.admit(tenant.keys[0], model="m", estimated_tokens=50, request_id=f"r{n}")
               for n in range(3)]
    durable.kill()
    await service.settle(answers[0].reservation, prompt_tokens=1, completion_tokens=1, model="m")
    await service.settle(answers[1].reservation, prompt_tokens=2, completion_tokens=2, model="m")
    assert isinstance(service, RedisQuotaService) and service.pending == 2
    restart_durable(durable)
    await asyncio.sleep(0.25)  # past the retry interval (0.2 s): the next call tries Redis again
    await service.settle(answers[2].reservation, prompt_tokens=4, completion_tokens=4, model="m")
    assert service.pending == 0 and not service.degraded
    usage = await service.admin.usage(key_id=tenant.keys[0].id)
    assert (usage.requests, usage.prompt_tokens) == (3, 7)
    # Every lease was released by its replayed settlement.
    assert sum([(await service.admit(tenant.keys[0], model="m", estimated_tokens=1, request_id=f"n{n}")).admitted
                for n in range(10)]) == 10
    await service.close()


async def test_a_hung_redis_costs_one_timeout_then_the_fallback(redis_server: RedisServer,
                                                                tmp_path: Path) -> None:
    settings = StoreSettings(redis_url=redis_server.url, data_dir=tmp_path, redis_timeout=0.3,
                             redis_retry_interval=0.2)
    service = await open_store(settings)
    tenant = await make_tenant(service, key={"rpm": 1000})
    assert (await service.admit(tenant.keys[0], model="m", estimated_tokens=1, request_id="seen")).admitted
    assert redis_server.proc is not None
    redis_server.proc.send_signal(signal.SIGSTOP)  # alive but silent: every read times out
    try:
        started = time.monotonic()
        answers = await asyncio.gather(*(service.admit(tenant.keys[0], model="m", estimated_tokens=1,
                                                       request_id=f"h{n}") for n in range(200)))
        assert time.monotonic() - started < 3.0  # the batch shares one timeout
        assert all(a.degraded and a.admitted for a in answers)  # rate limits degrade to local by default
    finally:
        redis_server.proc.send_signal(signal.SIGCONT)
    await wait_until_async(lambda: _admitted_from_redis(service, tenant.keys[0]),
                           what="an admission answered by Redis again")
    await service.close()


async def _admitted_from_redis(service: QuotaService, key) -> bool:  # type: ignore[no-untyped-def]
    answer = await service.admit(key, model="m", estimated_tokens=1, request_id="back")
    return answer.admitted and not answer.degraded
