"""Admin identities: admin keys with a role, hashed at rest and shown once, like API keys."""

from __future__ import annotations

import secrets
from dataclasses import dataclass, field, fields
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any, Protocol

from quota.admin.accounts import QuotaAdmin, hash_secret, new_id
from quota.records import InvalidRequest, NotFound

ADMIN_SECRET_PREFIX = "tga-"
PREFIX_LENGTH = 8


class Role(StrEnum):
    owner = "owner"  # everything, admin keys included
    operator = "operator"  # accounts, quotas, keys, channels, prices; not admin keys
    viewer = "viewer"  # reads only
    account_admin = "account_admin"  # one account's sub-accounts, keys, quotas and usage


@dataclass(slots=True)
class AdminKey:
    """An admin identity as listed; only the secret's SHA-256 is kept."""

    id: str
    role: Role
    account_id: str | None = None  # the account an account_admin manages
    name: str = ""
    prefix: str = ""
    created_at: datetime = field(default_factory=lambda: datetime.now(UTC))
    revoked_at: datetime | None = None

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in fields(self)}
        for name in ("created_at", "revoked_at"):
            if out[name] is not None:
                out[name] = out[name].isoformat()
        out["role"] = str(self.role)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AdminKey:
        values = dict(data)
        values["role"] = Role(values["role"])
        for name in ("created_at", "revoked_at"):
            if isinstance(values.get(name), str):
                values[name] = datetime.fromisoformat(values[name])
        return cls(**values)


@dataclass(slots=True)
class CreatedAdminKey:
    """The answer to create: the only time the secret is shown."""

    key: AdminKey
    secret: str


class AdminKeyCatalog(Protocol):
    async def put_admin_key(self, key: AdminKey, secret_hash: str | None = None) -> None: ...
    async def get_admin_key(self, key_id: str) -> AdminKey | None: ...
    async def admin_key_by_hash(self, secret_hash: str) -> AdminKey | None: ...
    async def list_admin_keys(self) -> list[AdminKey]: ...


class AdminKeys:
    """Create, list, revoke and authenticate admin keys; an account_admin key names an existing account."""

    def __init__(self, catalog: AdminKeyCatalog, tenancy: QuotaAdmin) -> None:
        self._catalog = catalog
        self._tenancy = tenancy

    async def create(self, role: object, account_id: object = None, name: object = "") -> CreatedAdminKey:
        if not isinstance(role, str) or role not in Role.__members__:
            raise InvalidRequest(f"role must be one of {', '.join(Role)}")
        if not isinstance(name, str) or len(name) > 200:
            raise InvalidRequest("name must be a string of at most 200 characters")
        if Role(role) is Role.account_admin:
            if not isinstance(account_id, str) or not account_id:
                raise InvalidRequest("an account_admin key needs account_id")
            await self._tenancy.get_account(account_id)
        elif account_id is not None:
            raise InvalidRequest(f"account_id applies to account_admin keys only, not to {role}")
        secret = ADMIN_SECRET_PREFIX + secrets.token_urlsafe(32)
        key = AdminKey(new_id("adm"), Role(role), account_id, name, secret[:PREFIX_LENGTH])
        await self._catalog.put_admin_key(key, hash_secret(secret))
        return CreatedAdminKey(key, secret)

    async def get(self, key_id: str) -> AdminKey:
        key = await self._catalog.get_admin_key(key_id)
        if key is None:
            raise NotFound(f"no admin key {key_id!r}")
        return key

    async def list(self) -> list[AdminKey]:
        return await self._catalog.list_admin_keys()

    async def revoke(self, key_id: str) -> AdminKey:
        key = await self.get(key_id)
        if key.revoked_at is None:
            key.revoked_at = datetime.now(UTC)
            await self._catalog.put_admin_key(key)
        return key

    async def authenticate(self, secret: str) -> AdminKey | None:
        """The live admin key with this secret; None when unknown or revoked (never cached: revocation is
        effective on the next request)."""
        if not secret.startswith(ADMIN_SECRET_PREFIX):
            return None
        key = await self._catalog.admin_key_by_hash(hash_secret(secret))
        return key if key is not None and key.revoked_at is None else None
