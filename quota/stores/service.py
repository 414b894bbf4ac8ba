"""The interface the gateway uses for every request: authenticate the key, admit (reserve the estimate on key,
sub-account and account at once), renew the concurrency leases while the request lives, then settle with the
real token counts, which refunds the unused part of the reservation."""

from __future__ import annotations

import logging
import time
from abc import ABC, abstractmethod
from datetime import UTC, datetime

from quota.admin.accounts import QuotaAdmin, hash_secret
from quota.admin.keys import AdminKeys
from quota.admin.money import MoneyAdmin
from quota.records import Account, Admission, ApiKey, AuthResult, KeyInfo, NotFound, Reservation
from quota.rules.audit import AuditLog
from quota.rules.quotes import Places

LAST_USED_INTERVAL = 60.0  # seconds between two last_used_at writes for one key, per process


def check_counts(**counts: int) -> None:
    """Token counts are non-negative integers: a negative estimate or usage would mint capacity."""
    for name, value in counts.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, not {value!r}")


def _verdict(key: ApiKey | None, info: KeyInfo | None) -> AuthResult:
    if key is None or info is None:
        return AuthResult(False, None, "unknown")
    if key.revoked_at is not None:
        return AuthResult(False, None, "revoked")
    if key.expires_at is not None and key.expires_at <= datetime.now(UTC):
        return AuthResult(False, None, "expired")
    return AuthResult(True, info)


class StoreUnavailable(Exception):
    """The store cannot be reached; services turn it into an answer, never let it reach the gateway."""


class QuotaService(ABC):
    """One atomic admission across key, sub-account and account, then settlement with real usage."""

    admin: QuotaAdmin
    admin_keys: AdminKeys
    audit: AuditLog

    def __init__(self, auth_cache_ttl: float) -> None:
        self._auth_ttl = auth_cache_ttl
        # secret hash -> (when read, the key, what the gateway is told of it: the key as its account bounds it)
        self._auth_cache: dict[str, tuple[float, ApiKey | None, KeyInfo | None]] = {}
        self._last_stamped: dict[str, float] = {}
        self._accounts: dict[str, Account | None] = {}  # account id -> the record last read (its key's terms)

    async def authenticate(self, secret: str) -> AuthResult:
        """Looks the secret's SHA-256 up; answers are cached at most `auth_cache_ttl` (<= 1 s)."""
        digest = hash_secret(secret)
        now = time.monotonic()
        cached = self._auth_cache.get(digest)
        if cached is not None and now - cached[0] < self._auth_ttl:
            _, key, info = cached
        else:
            try:
                key = await self._lookup_key(digest)
                account = None if key is None else await self._account(key.account_id)
            except StoreUnavailable:
                return AuthResult(False, None, "store_unavailable")
            if len(self._auth_cache) > 100_000:
                self._auth_cache.clear()
            info = None if key is None else KeyInfo.of(key, account)
            self._auth_cache[digest] = (now, key, info)
        verdict = _verdict(key, info)
        if key is not None and verdict.ok:
            await self._stamp_use(key.id, now)
        return verdict

    async def key_by_id(self, key_id: str) -> AuthResult:
        """The key a stored job runs as (a batch's lines), judged as `authenticate` judges a secret's."""
        try:
            key: ApiKey | None = await self.admin.get_key(key_id)
        except NotFound:
            key = None
        except Exception:  # an outage: the job waits, as a request would be refused with a 503
            logging.getLogger("tidegate.quota").warning("could not read the key %s", key_id)
            return AuthResult(False, None, "store_unavailable")
        if key is None:
            return _verdict(None, None)
        return _verdict(key, KeyInfo.of(key, await self._account(key.account_id)))

    async def _account(self, account_id: str) -> Account | None:
        """The key's account (its cache_scope and ceilings); while the store is out of reach, the last one read."""
        if not self.degraded:
            try:
                account: Account | None = await self.admin.get_account(account_id)
            except NotFound:
                account = None
            except Exception:  # an outage: a key the store policy lets through keeps its account's last terms
                logging.getLogger("tidegate.quota").warning("could not read the account %s", account_id)
            else:
                if len(self._accounts) > 100_000:
                    self._accounts.clear()
                self._accounts[account_id] = account
        return self._accounts.get(account_id)

    async def _stamp_use(self, key_id: str, now: float) -> None:
        """Records last_used_at at most once a minute per key, so that a busy key costs no write per request."""
        last = self._last_stamped.get(key_id)
        if self.degraded or (last is not None and now - last < LAST_USED_INTERVAL):
            return  # while the store is out of reach, a stamp would only add its timeout to the request
        if len(self._last_stamped) > 100_000:
            self._last_stamped.clear()
        self._last_stamped[key_id] = now
        try:
            await self.admin.record_use(key_id, datetime.now(UTC))
        except Exception:  # a lost stamp must never fail the request it describes
            logging.getLogger("tidegate.quota").warning("could not record last_used_at of key %s", key_id)

    def _forget_cached(self) -> None:
        self._auth_cache.clear()

    @abstractmethod
    async def _lookup_key(self, secret_hash: str) -> ApiKey | None:
        """The key with this secret hash, or None; raises StoreUnavailable when the store is out of reach."""

    money: MoneyAdmin

    @abstractmethod
    async def admit(self, key: KeyInfo, *, model: str, estimated_tokens: int, request_id: str,
                    max_output_tokens: int = 0, places: Places = ()) -> Admission:
        """Checks and reserves on every level at once; never raises for a store outage. `estimated_tokens`
        includes `max_output_tokens`, which the maximum cost prices at the output price. `places` says where the
        model is served, to price a model without a price of its own (quota/rules/quotes.py)."""

    @abstractmethod
    async def renew(self, reservation: Reservation) -> None:
        """Extends the reservation's concurrency leases while its request lives."""

    @abstractmethod
    async def settle(self, reservation: Reservation, *, prompt_tokens: int, completion_tokens: int,
                     model: str, cached_tokens: int = 0, channel: str | None = None, outcome: str = "ok") -> None:
        """Replaces the estimate with real usage and writes the ledger with the cost at the prices the request
        was admitted with (the channel's own price when it has one), and the request's audit record; a second
        call is a no-op."""

    @abstractmethod
    async def close(self) -> None: ...

    @property
    def degraded(self) -> bool:
        """True while a Redis-down policy is applied."""
        return False
