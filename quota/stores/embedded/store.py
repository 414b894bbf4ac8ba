"""The embedded store: tenancy and ledger in SQLite, counters in this process's memory."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace

from config.stores import StoreSettings
from quota.admin.accounts import QuotaAdmin
from quota.admin.keys import AdminKeys
from quota.admin.money import MoneyAdmin
from quota.money import Spend
from quota.records import Admission, ApiKey, KeyInfo, Level, Reservation
from quota.rules.audit import AuditLog
from quota.rules.quotes import Places, Quoter, refused_unpriced, settled_cost
from quota.rules.request_audit import AuditRecord
from quota.stores.embedded.catalog import SqliteCatalog
from quota.stores.local_admission import Charge, LocalAdmission
from quota.stores.service import QuotaService, check_counts

DB_NAME = "tidegate.sqlite3"


class EmbeddedQuotaService(QuotaService):
    """For one gateway process; several processes need the Redis store to share their counters."""

    def __init__(self, settings: StoreSettings, clock: Callable[[], float] = time.time) -> None:
        """`clock` is for tests of calendar boundaries; the gateway always runs on the real one."""
        super().__init__(settings.auth_cache_ttl)
        self._catalog = SqliteCatalog(settings.resolved_data_dir() / DB_NAME)
        self._local = LocalAdmission(settings.lease_ttl, seed=self._catalog.tokens_used, clock=clock)
        self._local.money.balances.update(self._catalog.balances())
        self._local.money.seed = self._catalog.cost_spent
        self._records_days = settings.request_records_retention_days
        self._catalog.records_retention = settings.request_records_retention_days * 86400
        self._charges: dict[str, list[Charge]] = {}
        self.admin = QuotaAdmin(self._catalog, on_change=self._forget, limits=settings.admin_limits)
        self.admin_keys = AdminKeys(self._catalog, self.admin)
        self.audit = AuditLog(self._catalog, settings.audit_retention_days * 86400)
        self._quoter = Quoter(self.admin.get_account, self._catalog.list_prices, settings.auth_cache_ttl, clock)
        self.money = MoneyAdmin(self._catalog, self.admin, self._quoter.forget, self._local.top_up, clock,
                                self._local.money.balances.get)

    def _forget(self) -> None:
        self._charges.clear()
        self._quoter.forget()
        self._forget_cached()

    async def _lookup_key(self, secret_hash: str) -> ApiKey | None:
        return await self._catalog.key_by_hash(secret_hash)

    async def _charges_of(self, key: KeyInfo) -> list[Charge]:
        charges = self._charges.get(key.id)
        if charges is None:
            charges = await charges_from_catalog(self.admin, key)
            self._charges[key.id] = charges
        return charges

    async def admit(self, key: KeyInfo, *, model: str, estimated_tokens: int, request_id: str,
                    max_output_tokens: int = 0, places: Places = ()) -> Admission:
        check_counts(estimated_tokens=estimated_tokens, max_output_tokens=max_output_tokens)
        charges = await self._charges_of(key)
        quote = await self._quoter.quote(key.account_id, model, max_output_tokens=max_output_tokens,
                                         prompt_tokens=max(estimated_tokens - max_output_tokens, 0), places=places)
        return refused_unpriced(self._local.admit(charges, key_id=key.id, model=model,
                                                  estimated_tokens=estimated_tokens, request_id=request_id,
                                                  quote=quote), quote)

    async def renew(self, reservation: Reservation) -> None:
        self._local.renew(reservation)

    async def settle(self, reservation: Reservation, *, prompt_tokens: int, completion_tokens: int,
                     model: str, cached_tokens: int = 0, channel: str | None = None, outcome: str = "ok") -> None:
        check_counts(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens, cached_tokens=cached_tokens)
        settled = replace(reservation, model=model)
        cost = settled_cost(reservation, prompt_tokens=prompt_tokens, cached_tokens=cached_tokens,
                            completion_tokens=completion_tokens, channel=channel)
        spend = Spend(min(cached_tokens, prompt_tokens), cost, channel or "")
        audit = AuditRecord.of(settled, prompt_tokens, completion_tokens, spend, outcome) if self._records_days else None
        self._local.settle(reservation, prompt_tokens + completion_tokens,
                           lambda: self._catalog.record_usage(settled, prompt_tokens, completion_tokens, spend, audit),
                           cost=cost)

    async def close(self) -> None:
        self._catalog.close()


async def charges_from_catalog(admin: QuotaAdmin, key: KeyInfo) -> list[Charge]:
    """The levels a key's admissions pass, each with its current quota."""
    api_key = await admin.get_key(key.id)
    charges = [Charge(Level.key, key.id, api_key.quota)]
    if key.sub_account_id is not None:
        sub = await admin.get_sub_account(key.sub_account_id)
        charges.append(Charge(Level.sub_account, sub.id, sub.quota))
    account = await admin.get_account(key.account_id)
    charges.append(Charge(Level.account, account.id, account.quota))
    return charges
