"""The admin side of money: prices with their history, and prepaid balances with their journal."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from quota.admin.accounts import QuotaAdmin
from quota.admin.catalog import Catalog
from quota.money import Price
from quota.rules.balance import BalanceEntry, parse_top_up
from quota.rules.prices import parse_price
from quota.rules.request_audit import AuditRecord


class MoneyAdmin:
    """`on_price` drops this replica's cached prices (others reread within their cache time). The embedded store
    keeps the live balance in memory: `on_top_up(account_id, amount)` moves it with the journal, and
    `live_balance(account_id)` reads it (with what in-flight requests hold, as Redis's does)."""

    def __init__(self, catalog: Catalog, admin: QuotaAdmin, on_price: Callable[[], None],
                 on_top_up: Callable[[str, int], None] = lambda account_id, amount: None,
                 clock: Callable[[], float] = time.time,
                 live_balance: Callable[[str], int | None] | None = None) -> None:
        self._live_balance = live_balance
        self._catalog = catalog
        self._admin = admin
        self._on_price = on_price
        self._on_top_up = on_top_up
        self._clock = clock

    async def set_price(self, model: str, body: dict[str, Any]) -> Price:
        price = parse_price(model, body, self._clock())
        await self._catalog.put_price(price)
        self._on_price()
        return price

    async def prices(self) -> list[Price]:
        """Every price ever set, oldest first."""
        return await self._catalog.list_prices()

    async def seed_prices(self, prices: list[Price]) -> None:
        """Config prices for models the store has never priced (a price set through the API wins)."""
        priced = {(p.model, p.channel) for p in await self._catalog.list_prices()}
        for price in prices:
            if (price.model, price.channel) not in priced:
                await self._catalog.put_price(price)

    async def top_up(self, account_id: str, body: dict[str, Any]) -> BalanceEntry:
        amount, note = parse_top_up(body)
        await self._admin.get_account(account_id)
        entry = await self._catalog.add_balance(account_id, amount, note, self._clock())
        self._on_top_up(account_id, amount)
        return entry

    async def requests(self, account_id: str, day: int, limit: int) -> list[AuditRecord]:
        """The account's audit records of one UTC day (days since the epoch), oldest first."""
        await self._admin.get_account(account_id)
        return await self._catalog.requests(account_id, day, limit)

    async def balance(self, account_id: str) -> tuple[int | None, list[BalanceEntry]]:
        await self._admin.get_account(account_id)
        balance, journal = await self._catalog.balance(account_id)
        return (balance if self._live_balance is None else self._live_balance(account_id)), journal
