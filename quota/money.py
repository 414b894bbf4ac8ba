"""Money records: amounts in integer micro-units, prices per million tokens, budgets over windows."""

from __future__ import annotations

import re
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from quota.errors import InvalidRequest

MICRO = 1_000_000  # money is kept in integer micro-units of the configured currency
BUDGET_WINDOW = re.compile(r"day|week|month|total|rolling_days:([1-9][0-9]?|[1-3][0-9][0-9])")


def to_micro(value: object, name: str) -> int:
    """A non-negative amount in currency units as integer micro-units, exactly (through its decimal text)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidRequest(f"{name} must be a non-negative number, not {value!r}")
    try:
        amount = Decimal(str(value)) * MICRO
    except InvalidOperation:
        raise InvalidRequest(f"{name} must be a number, not {value!r}") from None
    # the scripts' numbers are doubles: exact up to 2^53 micro-units, so amounts stop at a billion units
    if not amount.is_finite() or amount < 0 or amount > 10**15 or amount != amount.to_integral_value():
        raise InvalidRequest(f"{name} must be an amount from 0 to 10^9 with at most 6 decimals, not {value!r}")
    return int(amount)


def from_micro(value: int) -> float:
    """Micro-units back in currency units, for JSON answers (sums are always done on the integers)."""
    return float(Decimal(value) / MICRO)


@dataclass(slots=True, frozen=True)
class Budget:
    """A spend limit over a window, in micro-units; see docs/billing.md for the windows."""

    amount: int
    window: str

    def __post_init__(self) -> None:
        if not BUDGET_WINDOW.fullmatch(self.window):
            raise InvalidRequest("budget.window must be day, week, month, total or rolling_days:N (N 1..399)")

    @classmethod
    def from_dict(cls, data: object) -> Budget | None:
        if data is None:
            return None
        if not isinstance(data, dict) or set(data) != {"amount", "window"}:
            raise InvalidRequest("budget must be an object {\"amount\", \"window\"}")
        if not isinstance(data["window"], str):
            raise InvalidRequest("budget.window must be a string")
        return cls(to_micro(data["amount"], "budget.amount"), data["window"])

    def to_dict(self) -> dict[str, Any]:
        return {"amount": from_micro(self.amount), "window": self.window}

    def spec(self) -> str:
        """How the admit script reads it from a level's state hash."""
        return f"{self.amount} {self.window}"

    @classmethod
    def of_spec(cls, spec: str) -> Budget:
        amount, window = spec.split(" ", 1)
        return cls(int(amount), window)


@dataclass(slots=True, frozen=True)
class Price:
    """A model's price from `effective_from` (unix seconds) on, in micro-units per million tokens."""

    model: str
    input: int
    cached_input: int
    output: int
    channel: str | None = None  # None: every channel without a price of its own
    effective_from: float = 0.0


@dataclass(slots=True, frozen=True)
class Spend:
    """What settlement adds to the ledger beside the tokens."""

    cached_tokens: int = 0
    cost: int = 0  # micro-units
    channel: str = ""


@dataclass(slots=True)
class Quote:
    """A request priced at admission: its maximum cost, the prices it will be settled at, the account's
    multiplier (parts per million) and its calendar bounds (quota/rules/budget.py calendar_bounds)."""

    cost: int = 0
    prices: tuple[Price, ...] = ()
    multiplier: int = MICRO
    bounds: tuple[int, ...] = (0,) * 9


def micro_text(value: int) -> str:
    """Micro-units as exact decimal text in currency units (`1.250000`), for CSV."""
    return f"{Decimal(value) / MICRO:.6f}"
