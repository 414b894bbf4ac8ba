"""Prepaid balances: an append-only journal of top-ups and adjustments; the balance itself lives beside the
account's admission counters, so that admission and settlement move it atomically."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from quota.errors import InvalidRequest
from quota.money import MICRO, from_micro

MAX_NOTE = 500
JOURNAL_SHOWN = 1000  # the newest entries a GET returns


@dataclass(slots=True, frozen=True)
class BalanceEntry:
    at: float  # unix seconds
    amount: int  # micro-units; negative for a correction or a refund paid out
    note: str
    balance: int  # the balance right after this entry, micro-units

    def to_json(self) -> dict[str, Any]:
        return {"at": datetime.fromtimestamp(self.at, UTC).isoformat(), "amount": from_micro(self.amount),
                "note": self.note, "balance": from_micro(self.balance)}

    def encode(self) -> str:
        return f"{self.at:.3f}|{self.amount}|{self.balance}|{self.note}"

    @classmethod
    def decode(cls, text: str) -> BalanceEntry:
        at, amount, balance, note = text.split("|", 3)
        return cls(float(at), int(amount), note, int(balance))


def parse_top_up(body: dict[str, Any]) -> tuple[int, str]:
    """(amount in micro-units, note) of a POST body; the amount may be negative (an adjustment), never zero."""
    unknown = sorted(set(body) - {"amount", "note"})
    if unknown:
        raise InvalidRequest(f"unknown fields: {', '.join(unknown)}; allowed: amount, note")
    value, note = body.get("amount"), body.get("note", "")
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise InvalidRequest("amount must be a number (currency units; negative for an adjustment)")
    try:
        amount = Decimal(str(value)) * MICRO
    except InvalidOperation:
        raise InvalidRequest(f"amount must be a number, not {value!r}") from None
    if not amount.is_finite() or amount == 0 or abs(amount) > 10**15 or amount != amount.to_integral_value():
        raise InvalidRequest("amount must be non-zero, at most 10^9, with at most 6 decimals")
    if not isinstance(note, str) or len(note) > MAX_NOTE:
        raise InvalidRequest(f"note must be a string of at most {MAX_NOTE} characters")
    return int(amount), note


def balance_json(account_id: str, balance: int | None, journal: list[BalanceEntry]) -> dict[str, Any]:
    return {"account_id": account_id, "balance": None if balance is None else from_micro(balance),
            "journal": [e.to_json() for e in journal]}
