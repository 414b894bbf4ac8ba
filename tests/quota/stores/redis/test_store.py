"""The Redis store across processes: exact limits from 4 gateway workers, one Cluster slot per account."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import redis
from redis.crc import key_slot

from quota import QuotaService
from tests.quota.conftest import make_tenant
from tests.quota.redis_workers import process_bursts
from tests.servers import RedisServer

WORKERS = 4


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_four_processes_admit_exactly_the_limits(service: QuotaService, redis_server: RedisServer,
                                                       tmp_path: Path) -> None:
    rpm = await make_tenant(service, key={"rpm": 100})
    tpm = await make_tenant(service, key={"tpm": 20_000})
    shared = await make_tenant(service, keys=6, account={"rpm": 70}, sub={"rpm": 1000}, key={"rpm": 30})
    rng = random.Random(11)
    random_estimates = [[rng.randint(1, 900) for _ in range(500)] for _ in range(WORKERS)]
    ones = [[1] * 500 for _ in range(WORKERS)]
    with process_bursts(redis_server.url, tmp_path, WORKERS) as burst:
        assert len(burst(rpm.keys, ones)) == 100
        admitted = burst(tpm.keys, random_estimates)
        assert 20_000 - 900 < sum(admitted) <= 20_000
        assert len(burst(shared.keys, ones)) == 70


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_an_accounts_counters_share_one_cluster_slot(service: QuotaService,
                                                           redis_server: RedisServer) -> None:
    tenant = await make_tenant(service, keys=2, with_sub=True, account={"tokens_per_day": 10**6},
                               sub={"tpm": 10**6}, key={"rpm": 10, "max_concurrency": 5})
    for n, key in enumerate(tenant.keys):
        answer = await service.admit(key, model="m", estimated_tokens=10, request_id=f"r{n}")
        assert answer.reservation is not None
        await service.settle(answer.reservation, prompt_tokens=3, completion_tokens=4, model="m")
    client = redis.Redis.from_url(redis_server.url)
    tagged = [k for k in client.scan_iter(match=b"tg:{*")]
    assert len(tagged) >= 10
    assert {key_slot(k) for k in tagged} == {key_slot(f"{{acct:{tenant.account_id}}}".encode())}
    client.close()


@pytest.mark.parametrize("store_kind", ["redis"])
async def test_secret_is_stored_only_as_its_sha256(service: QuotaService, redis_server: RedisServer) -> None:
    tenant = await make_tenant(service)
    client = redis.Redis.from_url(redis_server.url)
    dump = b"".join(k + (client.dump(k) or b"") for k in client.scan_iter())
    assert tenant.secrets[0][3:].encode() not in dump
    client.close()
