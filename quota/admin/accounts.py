"""The admin Python API: accounts, sub-accounts and keys with their quotas, and usage reports."""

from __future__ import annotations

import hashlib
import secrets
from collections.abc import Callable
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from enum import Enum
from typing import Any, TypeVar

from config.stores import AdminLimits
from quota.admin.catalog import Catalog, UsageQuery
from quota.money import to_micro
from quota.records import (
    CACHE_SCOPES,
    Account,
    ApiKey,
    CreatedKey,
    InvalidRequest,
    NotFound,
    Quota,
    SubAccount,
    UsageReport,
)
from quota.rules.budget import zone
from quota.rules.calendar import parse_time
from quota.rules.ip_allowlist import parse_allowlist

SECRET_PREFIX = "tg-"
PREFIX_LENGTH = 8  # "tg-" and 5 of the 43 random characters: enough to tell keys apart, useless to guess
MAX_GRACE_SECONDS = 30 * 86400
MAX_MODELS, MAX_MODEL_NAME = 256, 128  # a key's or an account's models list: bounded like every admin field


class _Unset(Enum):
    token = 0


UNSET = _Unset.token  # "leave as is", distinct from None ("clear")


def hash_secret(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(8)}"


def _quota(value: Quota | dict[str, Any] | None) -> Quota:
    return value if isinstance(value, Quota) else Quota.from_dict(value)


def _name(value: object) -> str:
    if not isinstance(value, str) or len(value) > 200:
        raise InvalidRequest("name must be a string of at most 200 characters")
    return value


def _models(value: object) -> list[str] | None:
    if value is None:
        return None
    if (not isinstance(value, list) or len(value) > MAX_MODELS
            or not all(isinstance(m, str) and 0 < len(m) <= MAX_MODEL_NAME for m in value)):
        raise InvalidRequest(f"models must be a list of at most {MAX_MODELS} model names (each at most "
                             f"{MAX_MODEL_NAME} characters) or null")
    return list(dict.fromkeys(value))


def _priority_class(value: object) -> str | None:
    if value is not None and (not isinstance(value, str) or not value or len(value) > 64):
        raise InvalidRequest("priority_class must be a class name (a string) or null")
    return value


def _record_id(value: object, name: str) -> str:
    if not isinstance(value, str) or not value or len(value) > 100:
        raise InvalidRequest(f"{name} must be an id (a string)")
    return value


def _grace(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= MAX_GRACE_SECONDS:
        raise InvalidRequest(f"grace_seconds must be a number of seconds from 0 to {MAX_GRACE_SECONDS}")
    return float(value)


def _new_secret() -> tuple[str, str]:
    """(secret, its prefix)."""
    secret = SECRET_PREFIX + secrets.token_urlsafe(32)
    return secret, secret[:PREFIX_LENGTH]


Owner = TypeVar("Owner", Account, SubAccount)


def _renamed(record: Owner, name: str | _Unset, quota: Quota | dict[str, Any] | _Unset | None) -> Owner:
    if name is not UNSET:
        record.name = _name(name)
    if quota is not UNSET:
        record.quota = _quota(quota)
    return record


def _ceilings(account: Account, models: object, max_priority_class: object) -> None:
    """What every key of the account stays within (gateway.admin.ceilings checks account admins' writes)."""
    if models is not UNSET:
        account.models = _models(models)
    if max_priority_class is not UNSET:
        account.max_priority_class = _priority_class(max_priority_class)


def _cache_scope(account: Account, scope: str | _Unset) -> None:
    if scope is UNSET:
        return
    if scope not in CACHE_SCOPES:
        raise InvalidRequest(f"cache_scope must be one of {', '.join(CACHE_SCOPES)}")
    account.cache_scope = scope


def _money_terms(account: Account, timezone: str | _Unset, multiplier: float | _Unset) -> None:
    """The account's calendar for budgets, and the factor on every price it pays (> 0)."""
    if timezone is not UNSET:
        if not isinstance(timezone, str):
            raise InvalidRequest("timezone must be an IANA time zone name")
        account.timezone = zone(timezone).key
    if multiplier is not UNSET:
        if to_micro(multiplier, "price_multiplier") == 0:
            raise InvalidRequest("price_multiplier must be above 0")
        account.price_multiplier = float(multiplier)


class QuotaAdmin:
    """Create, list, update and revoke; every call validates its input and raises InvalidRequest or NotFound.

    `on_change` runs after each write, so that the owning store drops what it cached.
    """

    def __init__(self, catalog: Catalog, on_change: Callable[[], None] = lambda: None,
                 limits: AdminLimits | None = None) -> None:
        self._catalog = catalog
        self._on_change = on_change
        self._limits = limits or AdminLimits()

    async def create_account(self, name: str, quota: Quota | dict[str, Any] | None = None,
                             timezone: str = "UTC", price_multiplier: float = 1.0,
                             cache_scope: str = "account", models: list[str] | None = None,
                             max_priority_class: str | None = None) -> Account:
        account = Account(new_id("acct"), _name(name), _quota(quota))
        _money_terms(account, timezone, price_multiplier)
        _cache_scope(account, cache_scope)
        _ceilings(account, models, max_priority_class)
        await self._catalog.put_account(account)
        return account

    async def get_account(self, account_id: str) -> Account:
        account = await self._catalog.get_account(account_id)
        if account is None:
            raise NotFound(f"no account {account_id!r}")
        return account

    async def list_accounts(self) -> list[Account]:
        return await self._catalog.list_accounts()

    async def update_account(self, account_id: str, *, name: str | _Unset = UNSET,
                             quota: Quota | dict[str, Any] | _Unset | None = UNSET,
                             timezone: str | _Unset = UNSET, price_multiplier: float | _Unset = UNSET,
                             cache_scope: str | _Unset = UNSET, models: list[str] | _Unset | None = UNSET,
                             max_priority_class: str | _Unset | None = UNSET) -> Account:
        account = _renamed(await self.get_account(account_id), name, quota)
        _money_terms(account, timezone, price_multiplier)
        _cache_scope(account, cache_scope)
        _ceilings(account, models, max_priority_class)
        await self._catalog.put_account(account)
        self._on_change()
        return account

    async def create_sub_account(self, account_id: str, name: str,
                                 quota: Quota | dict[str, Any] | None = None) -> SubAccount:
        await self.get_account(account_id)
        if len(await self._catalog.list_sub_accounts(account_id)) >= self._limits.sub_accounts_per_account:
            raise InvalidRequest(f"account {account_id!r} has {self._limits.sub_accounts_per_account} sub-accounts, "
                                 "the most an account may have (admin_limits.sub_accounts_per_account)")
        sub = SubAccount(new_id("sub"), account_id, _name(name), _quota(quota))
        await self._catalog.put_sub_account(sub)
        return sub

    async def get_sub_account(self, sub_id: str) -> SubAccount:
        sub = await self._catalog.get_sub_account(sub_id)
        if sub is None:
            raise NotFound(f"no sub-account {sub_id!r}")
        return sub

    async def list_sub_accounts(self, account_id: str) -> list[SubAccount]:
        return await self._catalog.list_sub_accounts(account_id)

    async def update_sub_account(self, sub_id: str, *, name: str | _Unset = UNSET,
                                 quota: Quota | dict[str, Any] | _Unset | None = UNSET) -> SubAccount:
        sub = _renamed(await self.get_sub_account(sub_id), name, quota)
        await self._catalog.put_sub_account(sub)
        self._on_change()
        return sub

    async def create_key(self, *, account_id: str | None = None, sub_account_id: str | None = None,
                         name: str = "", models: list[str] | None = None,
                         quota: Quota | dict[str, Any] | None = None, priority_class: str | None = None,
                         expires_at: datetime | str | None = None,
                         allowed_ips: list[str] | None = None) -> CreatedKey:
        """Creates a key under an account or a sub-account; the secret is returned here and never again."""
        if sub_account_id is not None:
            sub = await self.get_sub_account(_record_id(sub_account_id, "sub_account_id"))
            if account_id is not None and account_id != sub.account_id:
                raise InvalidRequest("sub_account_id does not belong to account_id")
            account_id = sub.account_id
        elif account_id is None:
            raise InvalidRequest("account_id or sub_account_id is required")
        else:
            await self.get_account(_record_id(account_id, "account_id"))
        live = [k for k in await self._catalog.list_keys(account_id, None) if k.revoked_at is None]
        if len(live) >= self._limits.keys_per_account:
            raise InvalidRequest(f"account {account_id!r} has {len(live)} live keys, the most an account may have "
                                 "(admin_limits.keys_per_account): revoke one first")
        secret, prefix = _new_secret()
        key = ApiKey(new_id("key"), account_id, sub_account_id, _name(name), _models(models), _quota(quota),
                     _priority_class(priority_class), parse_time(expires_at),
                     allowed_ips=parse_allowlist(allowed_ips), prefix=prefix)
        await self._catalog.put_key(key, hash_secret(secret))
        return CreatedKey(key, secret)

    async def get_key(self, key_id: str) -> ApiKey:
        key = await self._catalog.get_key(key_id)
        if key is None:
            raise NotFound(f"no key {key_id!r}")
        return key

    async def list_keys(self, account_id: str | None = None, sub_account_id: str | None = None) -> list[ApiKey]:
        return await self._catalog.list_keys(account_id, sub_account_id)

    async def update_key(self, key_id: str, *, name: str | _Unset = UNSET,
                         models: list[str] | _Unset | None = UNSET,
                         quota: Quota | dict[str, Any] | _Unset | None = UNSET,
                         priority_class: str | _Unset | None = UNSET,
                         expires_at: datetime | str | _Unset | None = UNSET,
                         allowed_ips: list[str] | _Unset | None = UNSET) -> ApiKey:
        key = await self.get_key(key_id)
        changes: dict[str, Any] = {}
        if name is not UNSET:
            changes["name"] = _name(name)
        if models is not UNSET:
            changes["models"] = _models(models)
        if quota is not UNSET:
            changes["quota"] = _quota(quota)
        if priority_class is not UNSET:
            changes["priority_class"] = _priority_class(priority_class)
        if expires_at is not UNSET:
            changes["expires_at"] = parse_time(expires_at)
        if allowed_ips is not UNSET:
            changes["allowed_ips"] = parse_allowlist(allowed_ips)
        key = replace(key, **changes)
        await self._catalog.put_key(key)
        self._on_change()
        return key

    async def revoke_key(self, key_id: str) -> ApiKey:
        """Revokes at once; authentication everywhere refuses it within the 1 s auth cache."""
        key = await self.get_key(key_id)
        if key.revoked_at is None:
            key.revoked_at = datetime.now(UTC)
            await self._catalog.put_key(key)
        self._on_change()
        return key

    async def rotate_key(self, key_id: str, grace_seconds: object = 0) -> CreatedKey:
        """A new secret for the key; the old one keeps working for `grace_seconds`, then never again."""
        grace = _grace(grace_seconds)
        key = await self.get_key(key_id)
        if key.revoked_at is not None:
            raise InvalidRequest(f"key {key_id!r} is revoked: create a new key instead")
        secret, key.prefix = _new_secret()
        until = datetime.now(UTC) + timedelta(seconds=grace) if grace > 0 else None
        await self._catalog.rotate_key(key, hash_secret(secret), until)
        self._on_change()
        return CreatedKey(key, secret)

    async def record_use(self, key_id: str, when: datetime) -> None:
        await self._catalog.touch_key(key_id, when)

    async def usage(self, *, account_id: str | None = None, sub_account_id: str | None = None,
                    key_id: str | None = None, model: str | None = None, start: datetime | str | None = None,
                    end: datetime | str | None = None, granularity: str = "hour") -> UsageReport:
        """Prompt and completion tokens and request counts per period, key and model, with totals."""
        if granularity not in ("hour", "day"):
            raise InvalidRequest("granularity must be 'hour' or 'day'")
        query = UsageQuery(account_id, sub_account_id, key_id, model, parse_time(start, "start"), parse_time(end, "end"), granularity)
        return UsageReport.of(await self._catalog.usage(query))
