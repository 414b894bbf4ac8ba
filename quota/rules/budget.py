"""Budgets in currency and prepaid balances: the calendar bounds the admit script is given, and the embedded
store's twin of budget.lua (same fields, same rules), so both stores refuse and refund alike."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import date, datetime, time, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from quota.errors import InvalidRequest
from quota.money import Budget
from quota.records import Level, LimitName

BALANCE_RETRY = 3600.0  # a balance rises only with a top-up: waiting a little never helps
TOTAL_RETRY = 365 * 86400.0
CALENDAR = ("day", "week", "month")


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a region's folder ("America"), a long name
        raise InvalidRequest(f"timezone must be an IANA time zone name such as Asia/Shanghai, not {name!r}") from None


def calendar_bounds(timezone: str, sec: float) -> list[int]:
    """For day, week (from Monday) and month in `timezone`: the unix second at which the period holding `sec`
    starts, the next starts and the one after starts (nine numbers, the admit script's ARGV)."""
    tz = zone(timezone)
    today = datetime.fromtimestamp(sec, tz).date()
    monday = today - timedelta(days=today.weekday())
    first = today.replace(day=1)
    starts = {
        "day": [today + timedelta(days=n) for n in range(3)],
        "week": [monday + timedelta(weeks=n) for n in range(3)],
        "month": [first, _next_month(first), _next_month(_next_month(first))],
    }
    return [int(datetime.combine(d, time(0), tz).timestamp()) for name in CALENDAR for d in starts[name]]


def _next_month(first: date) -> date:
    return date(first.year + first.month // 12, first.month % 12 + 1, 1)


def budget_window(budget: Budget, bounds: list[int], sec: int) -> tuple[list[str], str | None, float]:
    """The spend fields the budget counts now (the one to charge last), the field leaving the window now and the
    second at which room frees; budget.lua's budget_window."""
    if budget.window == "total":
        return ["bt"], None, sec + TOTAL_RETRY
    if budget.window.startswith("rolling_days:"):
        n, day = int(budget.window.split(":")[1]), sec // 86400
        return [f"br{d}" for d in range(day - n + 1, day + 1)], f"br{day - n}", (day + 1) * 86400.0
    at = CALENDAR.index(budget.window) * 3
    i = 1 if sec >= bounds[at + 1] else 0
    return [f"bs{bounds[at + i]}"], None, float(bounds[at + i + 1])


@dataclass(slots=True)
class MoneyCharge:
    """What an admission charges one level: its budget field ('-' when none) and whether it holds the balance."""

    field: str = "-"
    stale: str | None = None
    balance: bool = False


# (level, id, first second, end second) -> micro-units the ledger holds for that level in that span
SpendSeed = Callable[[Level, str, int, int], int]
FOREVER = 2**40


def _span(spend_field: str, period_end: float) -> tuple[int, int]:
    """The seconds a spend field counts: `bt` always, `br<day>` one UTC day, `bs<start>` until the period ends."""
    if spend_field == "bt":
        return 0, FOREVER
    if spend_field.startswith("br"):
        day = int(spend_field[2:])
        return day * 86400, (day + 1) * 86400
    return int(spend_field[2:]), int(period_end)


@dataclass(slots=True)
class MoneyCounters:
    """Spend per level and period, and prepaid balances per account, in micro-units, in memory. With `seed`, a
    period first seen (after a restart) starts from the ledger's settled cost."""

    spend: dict[tuple[Level, str], dict[str, int]] = field(default_factory=dict)
    current: dict[tuple[Level, str], str] = field(default_factory=dict)
    balances: dict[str, int] = field(default_factory=dict)
    seed: SpendSeed | None = None

    def check(self, level: Level, level_id: str, budget: Budget | None, cost: int, bounds: list[int], sec: int,
              now: float) -> tuple[MoneyCharge, tuple[LimitName, float] | None]:
        """budget.lua's money_check: what to charge, and the refused limit with its wait when it does not fit."""
        charge = MoneyCharge(balance=level is Level.account and level_id in self.balances)
        if budget is not None:
            fields, stale, frees = budget_window(budget, bounds, sec)
            spent = self.spend.setdefault((level, level_id), {})
            if self.seed is not None:
                for name in fields:
                    if name not in spent:
                        spent[name] = self.seed(level, level_id, *_span(name, frees))
            if sum(spent.get(f, 0) for f in fields) + cost > budget.amount:
                return charge, (LimitName.budget, frees - now)
            charge.field, charge.stale = fields[-1], stale
        if charge.balance and self.balances[level_id] < cost:
            return charge, (LimitName.balance, BALANCE_RETRY)
        return charge, None

    def charge(self, level: Level, level_id: str, charge: MoneyCharge, cost: int) -> None:
        if charge.field != "-":
            spent = self.spend.setdefault((level, level_id), {})
            spent[charge.field] = spent.get(charge.field, 0) + cost
            if charge.stale is not None:
                spent.pop(charge.stale, None)
            if charge.field.startswith("bs"):
                current = self.current.get((level, level_id))
                if current != charge.field:
                    if current is not None:
                        spent.pop(current, None)
                    self.current[(level, level_id)] = charge.field
        if charge.balance:
            self.balances[level_id] -= cost

    def settle(self, level: Level, level_id: str, budget_field: str, delta: int, balance: bool) -> None:
        """budget.lua's money_settle: `delta` is the real cost less the reserved one."""
        spent = self.spend.get((level, level_id), {})
        if budget_field in spent:
            spent[budget_field] = max(spent[budget_field] + delta, 0)
        if balance and level_id in self.balances:
            # a cost above the reservation (the prompt was estimated) empties a balance, never overdraws it
            left = self.balances[level_id] - delta
            self.balances[level_id] = max(left, 0) if delta > 0 else left
