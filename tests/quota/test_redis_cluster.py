"""The Redis store on a real Redis Cluster (three masters, three replicas): every script and multi-key command
stays in one slot, limits hold exactly across processes, and a master's failover is survived."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import pytest
import redis
from redis.asyncio import Redis
from redis.crc import key_slot

from config import Breaker, Channel, Timeouts
from config.redis_url import ClusterUrl, cluster_url
from config.stores import StoreSettings
from gateway.channels.breaker_sync import BreakerSync
from gateway.channels.state import ChannelState
from limiter import CapacityLimit, RedisCapacity
from quota import Admission, Level, QuotaService, open_redis, open_routing_store, open_store
from quota.rules.audit import AuditEntry
from quota.stores.redis import keys as rk
from quota.stores.redis.routing import CHANNELS, DRAINING, GROUPS, SEEDED, VERSION
from tests.quota.conftest import TEST_REDIS_TIMEOUT, make_tenant
from tests.quota.redis_workers import process_bursts
from tests.redis_cluster import RedisClusterServers
from tests.waiting import wait_until_async

REPLICAS = 2


@pytest.fixture
async def cluster_service(redis_cluster: RedisClusterServers, tmp_path: Path) -> AsyncIterator[QuotaService]:
    settings = StoreSettings(redis_url=redis_cluster.url, data_dir=tmp_path, redis_timeout=TEST_REDIS_TIMEOUT,
                             redis_retry_interval=0.2)
    service = await open_store(settings)
    try:
        yield service
    finally:
        await service.close()


def test_a_cluster_url_names_its_seed_nodes_and_credentials() -> None:
    assert cluster_url("redis://127.0.0.1:6379/0") is None
    assert cluster_url("redis+cluster://a:7000, b:7001") == ClusterUrl((("a", 7000), ("b", 7001)))
    assert cluster_url("rediss+cluster://user:p%40ss@[::1]:7000/") == ClusterUrl((("::1", 7000),), True, "user", "p@ss")
    for bad in ("redis+cluster://", "redis+cluster://a", "redis+cluster://a:port"):
        with pytest.raises(ValueError, match="seed node"):
            cluster_url(bad)
        with pytest.raises(ValueError, match="seed node"):
            StoreSettings(redis_url=bad)


def test_the_keys_of_every_script_and_multi_key_command_share_one_slot() -> None:
    account = "a1b2"
    per_account = [*(k for level in Level for k in rk.level_keys(account, level, "x")),
                   rk.settled_key(account, "r1"), rk.ledger_key(account, "hour", 1), rk.ledger_key(account, "day", 1),
                   rk.ledger_index(account, "hour"), rk.ledger_index(account, "day"),
                   rk.request_records_key(account, 1), rk.balance_journal(account)]
    assert {key_slot(k.encode()) for k in per_account} == {key_slot(f"{{acct:{account}}}".encode())}
    routing = [CHANNELS, GROUPS, DRAINING, VERSION, SEEDED]
    assert len({key_slot(k.encode()) for k in routing}) == 1
    names = RedisCapacity(Redis())._keys([CapacityLimit("channel:a", 1, 1, 1), CapacityLimit("model:b", 1, 1, 1)])
    assert len({key_slot(k.encode()) for k in names}) == 1
    channel = ChannelState(Channel(name="c", base_url="http://127.0.0.1:1/v1", models=["m", "n"]), Timeouts(),
                           Breaker())
    assert len({key_slot(BreakerSync._key(channel, m).encode()) for m in ("m", "n")}) == 1


async def test_every_store_script_and_command_runs_on_the_cluster(cluster_service: QuotaService,
                                                                  redis_cluster: RedisClusterServers) -> None:
    service = cluster_service
    tenant = await make_tenant(service, with_sub=True, account={"tokens_per_day": 10**6},
                               sub={"tpm": 10**6},
                               key={"rpm": 10, "max_concurrency": 5, "request_bucket": {"rate": 5, "burst": 5},
                                    "token_bucket": {"rate": 1000, "burst": 10**5},
                                    "budget": {"amount": "100", "window": "month"}})
    await service.money.set_price("m", {"input": 1.0, "cached_input": 0.5, "output": 2.0})
    await service.money.top_up(tenant.account_id, {"amount": 10, "note": "prepaid"})
    answer = await service.admit(tenant.keys[0], model="m", estimated_tokens=30, request_id="r1",
                                 max_output_tokens=10)
    assert answer.admitted and answer.reservation is not None and not answer.degraded
    await service.renew(answer.reservation)
    await service.settle(answer.reservation, prompt_tokens=20, completion_tokens=5, model="m", channel="c")
    assert service.pending == 0 and not service.degraded
    usage = await service.admin.usage(account_id=tenant.account_id)
    assert (usage.requests, usage.prompt_tokens, usage.completion_tokens) == (1, 20, 5)
    day = int(datetime.now(UTC).timestamp() // 86400)
    assert [r.request_id for r in await service.money.requests(tenant.account_id, day, 10)] == ["r1"]
    balance, journal = await service.money.balance(tenant.account_id)
    assert balance is not None and [e.note for e in journal] == ["prepaid"]
    rotated = await service.admin.rotate_key(tenant.keys[0].id, grace_seconds=60)
    assert (await service.authenticate(rotated.secret)).ok and (await service.authenticate(tenant.secrets[0])).ok
    admin_key = await service.admin_keys.create("viewer", name="v")
    assert await service.admin_keys.authenticate(admin_key.secret) is not None
    await service.audit.append(AuditEntry("bootstrap", "owner", "test", None, None, {}, "q1", None))
    assert [e["action"] for e in await service.audit.read(action="test")] == ["test"]
    assert [k.id for k in await service.admin.list_keys(account_id=tenant.account_id)] == [tenant.keys[0].id]

    settings = StoreSettings(redis_url=redis_cluster.url, redis_timeout=TEST_REDIS_TIMEOUT)
    routing = open_routing_store(settings)
    assert await routing.seed({"c": {"base_url": "http://x"}}, {"g": {"targets": []}})
    await routing.put_channel("d", {"base_url": "http://y"})
    await routing.drain_channel("c")
    snapshot = await routing.snapshot()
    assert set(snapshot.channels) == {"c", "d"} and snapshot.draining == {"c"} and snapshot.version >= 3
    await routing.close()

    client = open_redis(redis_cluster.url, timeout=TEST_REDIS_TIMEOUT)
    capacity = RedisCapacity(client)
    limits = [CapacityLimit("channel:c", rate=10, burst=100, max_concurrency=1), CapacityLimit("model:m", 10, 100)]
    assert (await capacity.take(limits, 50, "r1", 30, 0.0)).ok
    refused = await capacity.take(limits, 50, "r2", 30, 0.0)
    assert not refused.ok and refused.refused == limits[0]  # the concurrency cap, from the cluster's leases
    await capacity.give_back(limits, 10, "r1", 0.0)
    channels = [ChannelState(Channel(name="c", base_url="http://127.0.0.1:1/v1", models=["m", "n"]), Timeouts(),
                             Breaker(consecutive_failures=1, cooldown=30))]
    sync = BreakerSync(client, channels, cooldown=30)
    channels[0].breaker("m").record(False)
    await sync.sync_once()  # a SET and an MGET over every breaker key in one pipeline
    assert await client.pttl("tidegate:{breaker}:c:m") > 0
    await sync.stop()


async def test_two_processes_on_the_cluster_admit_exactly_the_limits(cluster_service: QuotaService,
                                                                      redis_cluster: RedisClusterServers,
                                                                      tmp_path: Path) -> None:
    rpm = await make_tenant(cluster_service, keys=2, key={"rpm": 60})
    tpm = await make_tenant(cluster_service, key={"tpm": 20_000})
    rng = random.Random(7)
    random_estimates = [[rng.randint(1, 900) for _ in range(200)] for _ in range(REPLICAS)]
    ones = [[1] * 200 for _ in range(REPLICAS)]
    with process_bursts(redis_cluster.url, tmp_path, REPLICAS) as burst:
        assert len(burst(rpm.keys, ones)) == 120
        admitted = burst(tpm.keys, random_estimates)
        assert 20_000 - 900 < sum(admitted) <= 20_000


async def test_a_slot_moved_to_another_master_is_followed_with_the_limits_intact(
        cluster_service: QuotaService, redis_cluster: RedisClusterServers) -> None:
    service = cluster_service
    tenant = await make_tenant(service, key={"rpm": 10})
    key, tag = tenant.keys[0], rk.tag(tenant.account_id)

    async def admit(request_id: str) -> Admission:
        return await service.admit(key, model="m", estimated_tokens=1, request_id=request_id)

    answers = [await admit(f"a{n}") for n in range(3)]
    assert all(a.admitted and not a.degraded for a in answers)
    target = next(node for node in redis_cluster.masters() if node is not redis_cluster.master_of(tag))
    redis_cluster.move_slot(tag, target, finish=False)
    # ASK to the target; or, for a script on keys not all there yet, TRYAGAIN until the move ends: the
    # Redis-down policy meanwhile, never an error
    answers.append(await admit("during"))
    assert answers[-1].admitted
    redis_cluster.move_slot(tag, target, finish=True)  # the old master now answers MOVED
    assert redis_cluster.master_of(tag) is target

    async def served_by_the_target() -> Admission | None:
        answer = await admit("probe")
        answers.append(answer)
        return None if answer.degraded else answer

    await wait_until_async(served_by_the_target, timeout=30, what="admissions served after the move", interval=0.2)
    answers += [await admit(f"b{n}") for n in range(10)]
    assert not any(a.degraded for a in answers[-10:])
    assert sum(a.admitted for a in answers if not a.degraded) == 10  # what the cluster counted: exactly the RPM


async def test_a_master_failover_degrades_then_recovers_with_the_limits_intact(
        cluster_service: QuotaService, redis_cluster: RedisClusterServers) -> None:
    service = cluster_service
    tenant = await make_tenant(service, key={"rpm": 20})
    key = tenant.keys[0]
    admitted = [await service.admit(key, model="m", estimated_tokens=1, request_id=f"a{n}") for n in range(8)]
    assert all(a.admitted and not a.degraded for a in admitted)
    master = redis_cluster.master_of(rk.tag(tenant.account_id))
    with redis.Redis(port=master.port) as client:  # replication is asynchronous: let the replica catch up first
        assert client.wait(1, 5000) == 1
    master.kill()
    try:
        # before the replica takes over: the Redis-down policy (rate limits local, divided by the replicas)
        during = await service.admit(key, model="m", estimated_tokens=1, request_id="during")
        assert during.degraded and during.admitted
        assert during.reservation is not None and during.reservation.local

        async def served_by_the_new_master() -> bool:
            answer = await service.admit(key, model="m", estimated_tokens=0, request_id="probe")
            return not answer.degraded

        await wait_until_async(served_by_the_new_master, timeout=60, what="admissions served after the failover",
                               interval=0.2)
        answers = [await service.admit(key, model="m", estimated_tokens=1, request_id=f"b{n}") for n in range(20)]
        assert not any(a.degraded for a in answers)
        # the probe that found the new master counts too: 8 + 1 + 11 = the RPM of 20, nothing over it
        assert sum(a.admitted for a in answers) == 11
    finally:
        redis_cluster.restart(master)
