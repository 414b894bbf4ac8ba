"""The cost of a million tokens on own channels: each channel's running cost per day (its `cost_per_hour` times
the hours of that day so far) over the tokens it served that day."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

from quota.records import UsageRow

DAY = 86400


def unit_costs(rows: list[UsageRow], cost_per_hour: dict[str, float], now: float | None = None) -> list[dict[str, Any]]:
    """One entry per day and channel with a running cost, oldest first; unit cost null for a day without tokens."""
    now = time.time() if now is None else now
    tokens: dict[tuple[float, str], int] = {}
    for row in rows:
        if cost_per_hour.get(row.channel):
            day = row.period_start.timestamp()
            tokens[(day, row.channel)] = tokens.get((day, row.channel), 0) + row.prompt_tokens + row.completion_tokens
    out = []
    for (day, channel), served in sorted(tokens.items()):
        hours = Decimal(min(DAY, max(now - day, 0))) / 3600
        running = Decimal(str(cost_per_hour[channel])) * hours
        unit = running * 1_000_000 / served if served else None
        out.append({"day": time.strftime("%Y-%m-%d", time.gmtime(day)), "channel": channel, "tokens": served,
                    "hours": float(round(hours, 3)), "running_cost": float(round(running, 6)),
                    "cost_per_million_tokens": None if unit is None else float(round(unit, 6))})
    return out
