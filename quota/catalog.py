"""What a store must keep for the admin API: tenancy records by id, keys by secret hash, and usage rows."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from quota.audit import AuditRecord
from quota.balance import BalanceEntry
from quota.money import Price
from quota.records import Account, ApiKey, SubAccount, UsageRow


@dataclass(slots=True)
class UsageQuery:
    account_id: str | None = None
    sub_account_id: str | None = None
    key_id: str | None = None
    model: str | None = None
    start: datetime | None = None  # inclusive, by period start
    end: datetime | None = None  # exclusive
    granularity: str = "hour"  # "hour" | "day"

    def matches(self, row: UsageRow) -> bool:
        return ((self.account_id is None or row.account_id == self.account_id)
                and (self.sub_account_id is None or row.sub_account_id == self.sub_account_id)
                and (self.key_id is None or row.key_id == self.key_id)
                and (self.model is None or row.model == self.model))

    def period_bounds(self) -> tuple[int | None, int | None]:
        """The query's [first, last) period indexes, in hours or days since the epoch."""
        size = 3600 if self.granularity == "hour" else 86400
        first = -(-int(self.start.timestamp()) // size) if self.start else None
        last = -(-int(self.end.timestamp()) // size) if self.end else None
        return first, last


class Catalog(Protocol):
    async def put_account(self, account: Account) -> None: ...
    async def get_account(self, account_id: str) -> Account | None: ...
    async def list_accounts(self) -> list[Account]: ...
    async def put_sub_account(self, sub: SubAccount) -> None: ...
    async def get_sub_account(self, sub_id: str) -> SubAccount | None: ...
    async def list_sub_accounts(self, account_id: str) -> list[SubAccount]: ...
    async def put_key(self, key: ApiKey, secret_hash: str | None = None) -> None: ...
    async def get_key(self, key_id: str) -> ApiKey | None: ...
    async def key_by_hash(self, secret_hash: str) -> ApiKey | None: ...
    async def list_keys(self, account_id: str | None, sub_account_id: str | None) -> list[ApiKey]: ...
    async def usage(self, query: UsageQuery) -> list[UsageRow]: ...
    async def put_price(self, price: Price) -> None: ...
    async def list_prices(self) -> list[Price]: ...
    async def add_balance(self, account_id: str, amount: int, note: str, at: float) -> BalanceEntry: ...
    async def balance(self, account_id: str) -> tuple[int | None, list[BalanceEntry]]: ...
    async def requests(self, account_id: str, day: int, limit: int) -> list[AuditRecord]: ...
