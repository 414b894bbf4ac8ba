"""The cost of a million tokens on own channels: each channel's running cost per day (its `cost_per_hour` times
the hours of that day so far) over the tokens it served that day; per channel, or per model with each channel's
running cost split over the models it served by their share of its tokens."""

from __future__ import annotations

import time
from decimal import Decimal
from typing import Any

from quota.records import UsageRow

DAY = 86400


def unit_costs(rows: list[UsageRow], cost_per_hour: dict[str, float], now: float | None = None) -> list[dict[str, Any]]:
    """One entry per day and channel with a running cost, oldest first; unit cost null for a day without tokens."""
    now = time.time() if now is None else now
    out = []
    for (day, channel), served in sorted(_served(rows, cost_per_hour).items()):
        hours = _hours(day, now)
        running = Decimal(str(cost_per_hour[channel])) * hours
        out.append({"day": _day_text(day), "channel": channel, "tokens": sum(served.values()),
                    "hours": float(round(hours, 3)), **_cost(running, sum(served.values()))})
    return out


def unit_costs_by_model(rows: list[UsageRow], cost_per_hour: dict[str, float],
                        now: float | None = None) -> list[dict[str, Any]]:
    """One entry per day and model served by a channel with a running cost, oldest first. A channel's running
    cost that day is split over its models by token share, so every token a channel served costs the same."""
    now = time.time() if now is None else now
    tokens: dict[tuple[float, str], int] = {}
    running: dict[tuple[float, str], Decimal] = {}
    for (day, channel), served in _served(rows, cost_per_hour).items():
        channel_cost = Decimal(str(cost_per_hour[channel])) * _hours(day, now)
        channel_tokens = sum(served.values())
        for model, count in served.items():
            tokens[(day, model)] = tokens.get((day, model), 0) + count
            share = channel_cost * count / channel_tokens if channel_tokens else channel_cost / len(served)
            running[(day, model)] = running.get((day, model), Decimal(0)) + share
    return [{"day": _day_text(day), "model": model, "tokens": tokens[(day, model)],
             **_cost(running[(day, model)], tokens[(day, model)])} for day, model in sorted(tokens)]


def _served(rows: list[UsageRow], cost_per_hour: dict[str, float]) -> dict[tuple[float, str], dict[str, int]]:
    """Tokens per model, per day and channel with a running cost."""
    served: dict[tuple[float, str], dict[str, int]] = {}
    for row in rows:
        if cost_per_hour.get(row.channel):
            models = served.setdefault((row.period_start.timestamp(), row.channel), {})
            models[row.model] = models.get(row.model, 0) + row.prompt_tokens + row.completion_tokens
    return served


def _hours(day: float, now: float) -> Decimal:
    return Decimal(min(DAY, max(now - day, 0))) / 3600


def _day_text(day: float) -> str:
    return time.strftime("%Y-%m-%d", time.gmtime(day))


def _cost(running: Decimal, tokens: int) -> dict[str, float | None]:
    unit = running * 1_000_000 / tokens if tokens else None
    return {"running_cost": float(round(running, 6)),
            "cost_per_million_tokens": None if unit is None else float(round(unit, 6))}
