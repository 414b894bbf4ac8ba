"""Check-and-reserve across key, sub-account and account inside one critical section, in memory.

The embedded store's counters, and the Redis store's fallback while Redis is down. A threading lock
guards the section, so threads and asyncio tasks (which never await inside it) see one atomic step.
"""

from __future__ import annotations

import itertools
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from limiter import FixedWindow, LeaseSet, SlidingWindow, TokenBucket
from quota.money import Quote
from quota.records import Admission, Bucket, Level, LimitName, Quota, RateInfo, Reservation
from quota.rules.budget import MoneyCounters
from quota.rules.calendar import day_index, month_index, month_start

# (level, id, "day" | "month", period index) -> tokens already used in that period.
BudgetSeed = Callable[[Level, str, str, int], int]
CONCURRENCY_RETRY = 1.0  # a slot frees when some request ends; a second is an honest first guess
PRUNE_EVERY = 4096
FORGET_AFTER = 2 * 86400.0  # an unsettled reservation older than this is no longer settleable
# Reservation ids: random per process, then a counter; unique across replicas without a random draw each.
_ID_PREFIX = secrets.token_hex(6)
_ID_COUNTER = itertools.count()


def reservation_id(request_id: str) -> str:
    return f"{request_id}:{_ID_PREFIX}{next(_ID_COUNTER)}"


@dataclass(slots=True)
class Charge:
    """One level that an admission must pass and charge; a key's charges are [key, sub-account, account],
    without the middle one when the key has no sub-account."""

    level: Level
    id: str
    quota: Quota


@dataclass(slots=True)
class LevelCounters:
    requests: SlidingWindow = field(default_factory=SlidingWindow)
    tokens: SlidingWindow = field(default_factory=SlidingWindow)
    day: FixedWindow = field(default_factory=FixedWindow)
    month: FixedWindow = field(default_factory=FixedWindow)
    leases: LeaseSet = field(default_factory=LeaseSet)
    buckets: dict[LimitName, TokenBucket] = field(default_factory=dict)

    def bucket(self, name: LimitName, settings: Bucket) -> TokenBucket:
        found = self.buckets.get(name)
        if found is None:
            found = self.buckets[name] = TokenBucket(settings.rate, settings.burst)
        return found.tune(settings.rate, settings.burst)


def _bucket_costs(quota: Quota, est: int) -> list[tuple[LimitName, Bucket, int]]:
    """The token buckets a level has, with what this admission takes from each."""
    costs = [(LimitName.request_bucket, quota.request_bucket, 1), (LimitName.token_bucket, quota.token_bucket, est)]
    return [(name, bucket, cost) for name, bucket, cost in costs if bucket is not None]


@dataclass(slots=True)
class _Tightest:
    """Keeps the window with the least room left, for the x-ratelimit-* headers."""

    limit: int | None = None
    remaining: int | None = None
    reset: float | None = None

    def see(self, window: SlidingWindow, now: float, cost: int, limit: int) -> float | None:
        """Weighs `window`'s room after this cost; returns the wait when the cost does not fit, else None."""
        used = window.count(now)
        fits = used + cost <= limit
        remaining = max(limit - used - (cost if fits else 0), 0)
        if self.remaining is None or remaining < self.remaining:
            self.limit, self.remaining, self.reset = limit, remaining, window.reset(now)
        return None if fits else window.retry_after(now, used + cost - limit, cost, limit)


class LocalAdmission:
    def __init__(self, lease_ttl: float, seed: BudgetSeed | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.lease_ttl = lease_ttl
        self._seed = seed
        self._clock = clock
        self._lock = threading.Lock()
        self._levels: dict[tuple[Level, str], LevelCounters] = {}
        self._open: dict[str, Reservation] = {}
        self._admitted = 0
        self._months: dict[int, int] = {}
        self.money = MoneyCounters()

    def admit(self, charges: list[Charge], *, key_id: str, model: str, estimated_tokens: int,
              request_id: str, quote: Quote | None = None) -> Admission:
        """Admits on every level or on none; a refusal names the first level and limit that refused."""
        est = estimated_tokens
        with self._lock:
            now = self._clock()
            sec = int(now)
            day = day_index(sec)
            month = self._months.get(day)
            if month is None:
                month = self._months[day] = month_index(sec)
            requests, tokens = _Tightest(), _Tightest()
            refusal: tuple[Level, LimitName, float] | None = None
            found = []
            quote, money = quote or Quote(), []
            for charge in charges:
                counters = self._counters(charge, day, month)
                found.append(counters)
                q = charge.quota
                if q.rpm is not None:
                    wait = requests.see(counters.requests, now, 1, q.rpm)
                    if wait is not None and refusal is None:
                        refusal = (charge.level, LimitName.rpm, wait)
                if q.tpm is not None:
                    wait = tokens.see(counters.tokens, now, est, q.tpm)
                    if wait is not None and refusal is None:
                        refusal = (charge.level, LimitName.tpm, wait)
                for name, settings, cost in _bucket_costs(q, est):
                    wait = counters.bucket(name, settings).wait(now, cost)
                    if wait > 0 and refusal is None:
                        refusal = (charge.level, name, wait)
                if refusal is not None:
                    continue
                if q.max_concurrency is not None and counters.leases.live(now) >= q.max_concurrency:
                    refusal = (charge.level, LimitName.concurrency, CONCURRENCY_RETRY)
                elif q.tokens_per_day is not None and not counters.day.fits(est, q.tokens_per_day):
                    refusal = (charge.level, LimitName.tokens_per_day, (day + 1) * 86400 - now)
                elif q.tokens_per_month is not None and not counters.month.fits(est, q.tokens_per_month):
                    refusal = (charge.level, LimitName.tokens_per_month, month_start(month + 1) - now)
                # money (budget.py): the level's budget and the account's balance at the maximum cost
                spend, money_refusal = self.money.check(charge.level, charge.id, q.budget, quote.cost,
                                                        list(quote.bounds), sec, now)
                money.append(spend)
                if refusal is None and money_refusal is not None:
                    refusal = (charge.level, *money_refusal)
            rate = RateInfo(requests.limit, requests.remaining, requests.reset,
                            tokens.limit, tokens.remaining, tokens.reset)
            if refusal is not None:
                level, limit, retry = refusal
                return Admission(False, None, level, limit, max(retry, 0.0), rate)
            reservation = Reservation(
                id=reservation_id(request_id), request_id=request_id, key_id=key_id,
                sub_account_id=charges[1].id if len(charges) == 3 else None, account_id=charges[-1].id, model=model,
                estimated_tokens=est, slot=sec, day=day, month=month, local=True,
                cost=quote.cost, prices=quote.prices, multiplier=quote.multiplier,
                budget_fields=tuple(m.field for m in money), balance=money[-1].balance,
            )
            self._commit(charges, found, now, reservation)
            for charge, spend in zip(charges, money, strict=True):
                self.money.charge(charge.level, charge.id, spend, quote.cost)
            return Admission(True, reservation, rate=rate)

    def _counters(self, charge: Charge, day: int, month: int) -> LevelCounters:
        counters = self._levels.get((charge.level, charge.id))
        if counters is None:
            counters = self._levels[(charge.level, charge.id)] = LevelCounters()
        if counters.day.period != day:
            counters.day.roll(day, self._seed(charge.level, charge.id, "day", day) if self._seed else 0)
        if counters.month.period != month:
            counters.month.roll(month, self._seed(charge.level, charge.id, "month", month) if self._seed else 0)
        return counters

    def _commit(self, charges: list[Charge], found: list[LevelCounters], now: float,
                reservation: Reservation) -> None:
        est = reservation.estimated_tokens
        tpm_levels, lease_levels = [], []
        for charge, counters in zip(charges, found, strict=True):
            q = charge.quota
            if q.rpm is not None:
                counters.requests.add(now, 1)
            if q.tpm is not None:
                counters.tokens.add(now, est)
                tpm_levels.append(charge.level)
            if q.max_concurrency is not None:
                counters.leases.acquire(reservation.id, now, self.lease_ttl)
                lease_levels.append(charge.level)
            counters.day.count += est
            counters.month.count += est
            for name, settings, cost in _bucket_costs(q, est):
                counters.bucket(name, settings).take(now, cost)
        reservation.tpm_levels, reservation.lease_levels = tuple(tpm_levels), tuple(lease_levels)
        reservation.bucket_levels = tuple(c.level for c in charges if c.quota.token_bucket is not None)
        self._open[reservation.id] = reservation
        self._admitted += 1
        if self._admitted % PRUNE_EVERY == 0:
            self._prune(now)

    def _prune(self, now: float) -> None:
        stale = [rid for rid, res in self._open.items() if res.slot < now - FORGET_AFTER]
        for rid in stale:
            del self._open[rid]

    def renew(self, reservation: Reservation) -> None:
        with self._lock:
            now = self._clock()
            for level, level_id in reservation.levels():
                counters = self._levels.get((level, level_id))
                if counters is not None and level in reservation.lease_levels:
                    counters.leases.renew(reservation.id, now, self.lease_ttl)

    def top_up(self, account_id: str, amount: int) -> None:
        with self._lock:
            self.money.balances[account_id] = self.money.balances.get(account_id, 0) + amount

    def settle(self, reservation: Reservation, total_tokens: int,
               write_ledger: Callable[[], None] | None = None, cost: int = 0) -> bool:
        """Replaces the estimate with `total_tokens` and frees the slot; False when already settled.

        `write_ledger` runs inside the same critical section, before any counter moves.
        """
        with self._lock:
            if self._open.pop(reservation.id, None) is None:
                return False
            if write_ledger is not None:
                try:
                    write_ledger()
                except BaseException:
                    self._open[reservation.id] = reservation
                    raise
            delta = total_tokens - reservation.estimated_tokens
            now = self._clock()
            for level, level_id in reservation.levels():
                counters = self._levels.get((level, level_id))
                if counters is None:
                    continue
                if level in reservation.tpm_levels:
                    counters.tokens.adjust(reservation.slot, delta)
                counters.day.adjust(reservation.day, delta)
                counters.month.adjust(reservation.month, delta)
                counters.leases.release(reservation.id)
                bucket = counters.buckets.get(LimitName.token_bucket)
                if bucket is not None and level in reservation.bucket_levels:
                    bucket.adjust(now, -delta)
            for (level, level_id), spent in zip(reservation.levels(), reservation.budget_fields, strict=False):
                self.money.settle(level, level_id, spent, cost - reservation.cost,
                                  reservation.balance and level is Level.account)
            return True

    def is_open(self, reservation: Reservation) -> bool:
        return reservation.id in self._open
