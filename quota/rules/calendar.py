"""UTC calendar periods as integers, matching limiter/clock.lua: days since epoch and year * 12 + month - 1."""

from __future__ import annotations

from datetime import UTC, datetime


def day_index(sec: float) -> int:
    return int(sec // 86400)


def month_index(sec: float) -> int:
    moment = datetime.fromtimestamp(sec, UTC)
    return moment.year * 12 + moment.month - 1


def month_start(index: int) -> float:
    """Unix second at which month `index` starts."""
    return datetime(index // 12, index % 12 + 1, 1, tzinfo=UTC).timestamp()


def month_days(index: int) -> tuple[int, int]:
    """First and last day index of month `index`."""
    return day_index(month_start(index)), day_index(month_start(index + 1)) - 1
