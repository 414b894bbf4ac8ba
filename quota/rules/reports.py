"""Usage reports: ledger rows grouped by any of account, sub-account, key, model and channel, over hours, days
or months, with tokens, requests and cost; as JSON rows or CSV."""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from quota.errors import InvalidRequest
from quota.money import from_micro, micro_text
from quota.records import UsageRow

GROUPS = {"account": "account_id", "sub_account": "sub_account_id", "key": "key_id", "model": "model",
          "channel": "channel"}
GRANULARITIES = ("hour", "day", "month")
COUNTS = ("prompt_tokens", "cached_tokens", "completion_tokens", "requests")


@dataclass(slots=True)
class ReportRow:
    period_start: datetime
    group: dict[str, str | None]
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))
    cost: int = 0  # micro-units

    def to_json(self) -> dict[str, Any]:
        return {"period_start": self.period_start.isoformat(), **self.group, **self.counts,
                "cost": from_micro(self.cost)}


def parse_group_by(text: str | None) -> tuple[str, ...]:
    names = tuple(n.strip() for n in (text or "").split(",") if n.strip())
    unknown = [n for n in names if n not in GROUPS]
    if unknown or len(set(names)) != len(names):
        raise InvalidRequest(f"group_by takes distinct names among {', '.join(GROUPS)}")
    return names


def check_granularity(granularity: str) -> str:
    if granularity not in GRANULARITIES:
        raise InvalidRequest(f"granularity must be one of {', '.join(GRANULARITIES)}")
    return granularity


def month_of(moment: datetime) -> datetime:
    return datetime(moment.year, moment.month, 1, tzinfo=UTC)


def grouped(rows: list[UsageRow], group_by: tuple[str, ...], granularity: str) -> list[ReportRow]:
    """Sums ledger rows (hours, or days for days and months) per period and group, oldest period first."""
    out: dict[tuple[Any, ...], ReportRow] = {}
    for row in rows:
        start = month_of(row.period_start) if granularity == "month" else row.period_start
        group = {name: getattr(row, GROUPS[name]) or None for name in group_by}
        found = out.get((start, *group.values()))
        if found is None:
            found = out[(start, *group.values())] = ReportRow(start, group)
        for name in COUNTS:
            found.counts[name] += getattr(row, name)
        found.cost += row.cost
    return sorted(out.values(), key=lambda r: (r.period_start, *(v or "" for v in r.group.values())))


def report_json(rows: list[ReportRow], currency: str) -> dict[str, Any]:
    totals = {name: sum(r.counts[name] for r in rows) for name in COUNTS}
    return {"object": "list", "currency": currency, "data": [r.to_json() for r in rows], **totals,
            "cost": from_micro(sum(r.cost for r in rows))}


def report_csv(rows: list[ReportRow], group_by: tuple[str, ...]) -> str:
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["period_start", *group_by, *COUNTS, "cost"])
    for r in rows:
        writer.writerow([r.period_start.isoformat(), *(r.group[n] or "" for n in group_by),
                         *(r.counts[n] for n in COUNTS), micro_text(r.cost)])
    return out.getvalue()
