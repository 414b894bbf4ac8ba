"""Prices a request at admission (the model's prices in force now, the account's multiplier and calendar) and
at settlement (its real usage at the prices it was admitted with)."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from quota.money import Price, Quote
from quota.records import Account, Admission, LimitName, Reservation
from quota.rules.budget import calendar_bounds
from quota.rules.prices import (
    PriceList,
    SharedRead,
    in_force,
    max_cost,
    multiplier_ppm,
    price_for,
    request_cost,
)

# where a public model may be served: (channel, the names its price may be kept under, first found wins)
Places = tuple[tuple[str, tuple[str, ...]], ...]
# the maximum cost of a model without any price: more than any balance or budget holds, so accounts that pay are
# refused it (an account that pays nothing is charged min(real, reserved) = 0 of it)
UNPRICED = 10**15


class Quoter:
    """Reads prices and account terms through short caches (`ttl`, as for keys), so admission stays one store
    round trip; `clock` is the gateway's, which picks the calendar periods the store's clock chooses among."""

    def __init__(self, load_account: Callable[[str], Awaitable[Account]], load_prices: Callable[[], Awaitable[list[Price]]], ttl: float,
                 clock: Callable[[], float] = time.time) -> None:
        self._load_account = load_account
        self.prices = PriceList(load_prices, ttl)
        self._ttl = ttl
        self._clock = clock
        self._accounts: dict[str, tuple[float, Account]] = {}
        self._account_reads: SharedRead[Account] = SharedRead()
        self._bounds: dict[str, tuple[int, tuple[int, ...]]] = {}

    async def quote(self, account_id: str, model: str, *, prompt_tokens: int, max_output_tokens: int,
                    places: Places = ()) -> Quote:
        account = await self._account(account_id)
        await self.prices.of_model(model)
        return self.last_known(account_id, model, prompt_tokens=prompt_tokens, max_output_tokens=max_output_tokens,
                               account=account, places=places)

    def last_known(self, account_id: str, model: str, *, prompt_tokens: int, max_output_tokens: int,
                   account: Account | None = None, places: Places = ()) -> Quote:
        """The quote from what was last read, without the store: for admissions while it is out of reach (an
        account never read is priced at no cost, which only a fail-open budget policy lets through)."""
        now = self._clock()
        if account is None:
            cached = self._accounts.get(account_id)
            if cached is None:
                return Quote()
            account = cached[1]
        prices = in_force(self.prices.last_read(model), model, now) or self._stand_ins(model, places, now)
        multiplier = multiplier_ppm(account.price_multiplier)
        cost = max_cost(prices, multiplier, prompt_tokens=prompt_tokens, max_output_tokens=max_output_tokens)
        return Quote(cost if prices or not places else UNPRICED, prices, multiplier,
                     self._calendar(account.timezone, now))

    def _stand_ins(self, model: str, places: Places, now: float) -> tuple[Price, ...]:
        """A model without a price of its own (a group) priced per channel at what each place serves: admission
        reserves the highest, settlement takes the serving channel's."""
        found: dict[str, Price] = {}
        for channel, names in places:
            price = next((p for name in names
                          if (p := price_for(in_force(self.prices.last_read(name), name, now), channel))), None)
            known = found.get(channel)
            if price is not None and (known is None or (price.output, price.input) > (known.output, known.input)):
                found[channel] = Price(model, price.input, price.cached_input, price.output, channel,
                                       price.effective_from)
        return tuple(found.values())

    async def _account(self, account_id: str) -> Account:
        cached = self._accounts.get(account_id)
        if cached is not None and time.monotonic() - cached[0] < self._ttl:
            return cached[1]
        account = await self._account_reads.read(account_id, lambda: self._load_account(account_id))
        if len(self._accounts) > 100_000:
            self._accounts.clear()
        self._accounts[account_id] = (time.monotonic(), account)
        return account

    def _calendar(self, timezone: str, now: float) -> tuple[int, ...]:
        """Bounds change once a day per time zone: computed then, reused until the next day starts."""
        cached = self._bounds.get(timezone)
        if cached is not None and cached[1][0] <= now < cached[0]:
            return cached[1]
        bounds = tuple(calendar_bounds(timezone, now))
        self._bounds[timezone] = (bounds[1], bounds)
        return bounds

    def forget(self) -> None:
        self.prices.forget()
        self._accounts.clear()


def refused_unpriced(admission: Admission, quote: Quote) -> Admission:
    """A refusal for money that only an unpriced model's maximum cost caused, named for what it is."""
    if quote.cost >= UNPRICED and admission.refused_limit in (LimitName.balance, LimitName.budget):
        admission.refused_limit, admission.retry_after = LimitName.unpriced, None
    return admission


def settled_cost(reservation: Reservation, *, prompt_tokens: int, cached_tokens: int, completion_tokens: int,
                 channel: str | None) -> int:
    """The real cost at the prices in force when the request was admitted. It can pass the reservation by the
    prompt estimate's error; settlement then takes a balance to zero, never below."""
    return request_cost(price_for(reservation.prices, channel), reservation.multiplier, prompt_tokens=prompt_tokens,
                        cached_tokens=cached_tokens, completion_tokens=completion_tokens)
