"""Admin keys, the audit log, key rotation and last_used_at on every store (SQLite and a real redis-server)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from quota import QuotaService, open_store
from quota.admin.keys import Role
from quota.rules.audit import AuditEntry
from tests.quota.conftest import make_tenant, store_settings
from tests.waiting import wait_until_async


async def test_admin_keys_are_shown_once_stored_hashed_and_refused_once_revoked(service: QuotaService) -> None:
    account = await service.admin.create_account("acme")
    created = await service.admin_keys.create("account_admin", account.id, "tenant")
    assert created.secret.startswith("tga-") and created.key.prefix == created.secret[:8]
    found = await service.admin_keys.authenticate(created.secret)
    assert found is not None and found.role is Role.account_admin and found.account_id == account.id
    assert created.secret not in json.dumps([k.to_json() for k in await service.admin_keys.list()])
    await service.admin_keys.revoke(created.key.id)
    assert await service.admin_keys.authenticate(created.secret) is None
    with pytest.raises(ValueError, match="account_id"):
        await service.admin_keys.create("account_admin")
    with pytest.raises(ValueError, match="role"):
        await service.admin_keys.create("root")


async def test_a_rotated_secret_works_until_its_grace_ends_and_a_revocation_ends_it_at_once(
        service: QuotaService) -> None:
    tenant = await make_tenant(service)
    old = tenant.secrets[0]
    rotated = await service.admin.rotate_key(tenant.keys[0].id, grace_seconds=1.5)
    assert (await service.authenticate(old)).ok and (await service.authenticate(rotated.secret)).ok

    async def old_refused() -> bool:
        return not (await service.authenticate(old)).ok

    await wait_until_async(old_refused, timeout=30, what="the grace period to end")
    assert (await service.authenticate(rotated.secret)).ok

    again = await service.admin.rotate_key(tenant.keys[0].id, grace_seconds=3600)
    await service.admin.revoke_key(tenant.keys[0].id)
    for secret in (rotated.secret, again.secret):  # revoking a key ends its grace secrets too
        assert (await service.authenticate(secret)).reason == "revoked"


async def test_a_rotation_ends_every_earlier_grace_secret(service: QuotaService) -> None:
    tenant = await make_tenant(service)
    first = tenant.secrets[0]
    second = await service.admin.rotate_key(tenant.keys[0].id, grace_seconds=3600)
    assert (await service.authenticate(first)).ok
    third = await service.admin.rotate_key(tenant.keys[0].id, grace_seconds=0)
    for secret in (first, second.secret):  # neither the first rotation's old secret nor the second's lives on
        assert (await service.authenticate(secret)).reason == "unknown"
    assert (await service.authenticate(third.secret)).ok
    fourth = await service.admin.rotate_key(tenant.keys[0].id, grace_seconds=3600)
    fifth = await service.admin.rotate_key(tenant.keys[0].id, grace_seconds=3600)
    assert not (await service.authenticate(third.secret)).ok  # only the secret the last rotation replaced
    assert (await service.authenticate(fourth.secret)).ok and (await service.authenticate(fifth.secret)).ok


async def test_last_used_at_is_written_once_a_minute_per_key_not_per_request(service: QuotaService) -> None:
    tenant = await make_tenant(service)  # authenticates once
    first = (await service.admin.get_key(tenant.keys[0].id)).last_used_at
    assert first is not None
    await service.authenticate(tenant.secrets[0])
    listed = await service.admin.list_keys(tenant.account_id)
    assert [k.last_used_at for k in listed] == [first]


async def test_audit_entries_come_back_newest_first_filtered_and_without_secrets(service: QuotaService) -> None:
    channel = {"name": "cloud", "api_key": "sk-live-abcdef", "base_url": "https://user:pw@api.example.com/v1"}
    secret = "tg-" + "x" * 43
    await service.audit.append(AuditEntry("bootstrap", "owner", "channels.create", "cloud", None, channel, "r1", None))
    await service.audit.append(AuditEntry("adm_1", "operator", "keys.create", "key_1", None,
                                          {"id": "key_1", "key": secret, "note": f"made {secret}"}, "r2", "::1"))
    entries = await service.audit.read()
    assert [e["request_id"] for e in entries] == ["r2", "r1"]
    text = json.dumps(entries)
    for leaked in ("sk-live-abcdef", secret, "user:pw"):
        assert leaked not in text
    assert [e["action"] for e in await service.audit.read(actor="adm_1")] == ["keys.create"]
    assert await service.audit.read(action="keys.revoke") == []
    assert len(await service.audit.read(limit=1)) == 1
    with pytest.raises(ValueError):
        await service.audit.read(limit=0)


async def test_audit_entries_older_than_the_retention_are_dropped(store_kind: str, tmp_path: Path,
                                                                  request: pytest.FixtureRequest) -> None:
    server = request.getfixturevalue("redis_server") if store_kind == "redis" else None
    service = await open_store(store_settings(store_kind, tmp_path, server, audit_retention_days=1 / 86400))
    try:
        await service.audit.append(AuditEntry("bootstrap", "owner", "accounts.create", "a", None, {}, "old", None))

        async def old_dropped() -> bool:
            await service.audit.append(AuditEntry("bootstrap", "owner", "accounts.create", "b", None, {}, "new", None))
            return "old" not in [e["request_id"] for e in await service.audit.read(limit=1000)]

        await wait_until_async(old_dropped, timeout=30, what="the old entry to pass the retention",
                               interval=0.2)
    finally:
        await service.close()
