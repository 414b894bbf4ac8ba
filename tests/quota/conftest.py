"""Quota fixtures: each store opened for real (SQLite in tmp_path, or a real redis-server)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from config.stores import StoreSettings
from quota import KeyInfo, QuotaService, open_store
from tests.servers import RedisServer

STORES = ["embedded"]


def store_settings(kind: str, tmp_path: Path, redis_server: RedisServer | None, **extra: Any) -> StoreSettings:
    url = redis_server.url if kind == "redis" and redis_server is not None else None
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
