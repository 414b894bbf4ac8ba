"""Quota fixtures: each store opened for real (SQLite in tmp_path, or a real redis-server)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from config.stores import StoreSettings
from quota import KeyInfo, QuotaService, open_store
from tests.servers import RedisServer
from tests.waiting import wait_until

STORES = ["embedded", "redis"]
TEST_REDIS_TIMEOUT = 3.0


def store_settings(kind: str, tmp_path: Path, redis_server: RedisServer | None, **extra: Any) -> StoreSettings:
    url = redis_server.url if kind == "redis" and redis_server is not None else None
    # A shared 2-core test machine can stall a loopback reply past the 0.5 s production default.
    extra.setdefault("redis_timeout", TEST_REDIS_TIMEOUT)
    return StoreSettings(data_dir=tmp_path / "data", redis_url=url, **extra)


@pytest.fixture(params=STORES)
def store_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def settings(store_kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> StoreSettings:
    server = request.getfixturevalue("redis_server") if store_kind == "redis" else None
    return store_settings(store_kind, tmp_path, server, lease_ttl=0.6)


@pytest.fixture
async def service(settings: StoreSettings) -> AsyncIterator[QuotaService]:
    svc = await open_store(settings)
    try:
        yield svc
    finally:
        await svc.close()


@dataclass(slots=True)
class Tenant:
    account_id: str
    sub_account_id: str | None
    keys: list[KeyInfo]
    secrets: list[str]


async def make_tenant(service: QuotaService, *, keys: int = 1, account: dict[str, int] | None = None,
                      sub: dict[str, int] | None = None, key: dict[str, int] | None = None,
                      with_sub: bool = False) -> Tenant:
    """An account (optionally with one sub-account) holding `keys` keys, all with the given quotas."""
    acct = await service.admin.create_account("acct", account)
    sub_id = None
    if with_sub or sub is not None:
        sub_id = (await service.admin.create_sub_account(acct.id, "sub", sub)).id
    infos, secrets = [], []
    for n in range(keys):
        created = await service.admin.create_key(account_id=acct.id, sub_account_id=sub_id, name=f"k{n}",
                                                 quota=key)
        auth = await service.authenticate(created.secret)
        assert auth.ok and auth.key is not None
        infos.append(auth.key)
        secrets.append(created.secret)
    return Tenant(acct.id, sub_id, infos, secrets)


def make_durable(server: RedisServer) -> None:
    """Turns on fsync-always AOF at runtime, so that a killed server comes back with every write."""
    client = redis.Redis.from_url(server.url)
    client.config_set("appendonly", "yes")
    client.config_set("appendfsync", "always")

    def aof_written() -> bool:
        info = client.info("persistence")
        return bool(info["aof_enabled"] and not info["aof_rewrite_in_progress"]
                    and not info["aof_rewrite_scheduled"])

    wait_until(aof_written, timeout=30, what="redis-server's first append-only file written")
    client.close()


def restart_durable(server: RedisServer) -> None:
    """Starts redis-server again on the same port and folder, loading the AOF that make_durable began."""
    server.persistent = True
    server.start()
