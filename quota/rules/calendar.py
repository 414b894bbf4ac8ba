"""UTC calendar periods as integers, matching limiter/clock.lua: days since epoch and year * 12 + month - 1; and
the ISO 8601 times admin calls name."""

from __future__ import annotations

from datetime import UTC, datetime

from quota.errors import InvalidRequest


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


def parse_time(value: object, name: str = "expires_at") -> datetime | None:
    """An ISO 8601 time from an admin body or query (UTC when it names no offset), or None."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            raise InvalidRequest(f"{name} is not an ISO 8601 time: {value!r}") from None
    if not isinstance(value, datetime):
        raise InvalidRequest(f"{name} must be an ISO 8601 time or null")
    return value if value.tzinfo else value.replace(tzinfo=UTC)
