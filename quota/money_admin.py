"""The admin side of money: prices with their history, and prepaid balances with their journal."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from quota.admin import QuotaAdmin
from quota.balance import BalanceEntry, parse_top_up
from quota.catalog import Catalog
from quota.money import Price
from quota.prices import parse_price


class MoneyAdmin:
    """`on_top_up(account_id, amount)` lets the embedded store move its in-memory balance with the journal."""

    def __init__(self, catalog: Catalog, admin: QuotaAdmin,
                 on_top_up: Callable[[str, int], None] = lambda account_id, amount: None,
                 clock: Callable[[], float] = time.time) -> None:
        self._catalog = catalog
        self._admin = admin
        self._on_top_up = on_top_up
        self._clock = clock

    async def set_price(self, model: str, body: dict[str, Any]) -> Price:
        price = parse_price(model, body, self._clock())
        await self._catalog.put_price(price)
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

    async def balance(self, account_id: str) -> tuple[int | None, list[BalanceEntry]]:
        await self._admin.get_account(account_id)
        return await self._catalog.balance(account_id)
