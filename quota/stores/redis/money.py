"""The Redis store's money parts: scripts composed with budget.lua, budget.lua's refusal codes, and the
per-request audit line, appended by its settlement's own script call (settle.lua)."""

from __future__ import annotations

from limiter import libraries
from limiter.lua import read_lua
from quota.money import Spend
from quota.records import LimitName, Reservation
from quota.rules.request_audit import AuditRecord
from quota.stores.redis import keys as rk

MONEY_CODES = {21: LimitName.budget, 22: LimitName.balance}


def quota_script(entry: str, clock_lua: str = "") -> str:
    """An entry script of quota/ after the limiter libraries and quota's own money library; `clock_lua`, a
    test's own `server_time`, shadows Redis TIME for the entry script only."""
    return "\n".join((libraries(), clock_lua, read_lua("quota.stores.redis", "budget"), read_lua("quota.stores.redis", entry)))


class AuditLines:
    """Each settled request's line, for its account's list of the day; the list expires with the retention, so no
    sweeper is needed."""

    def __init__(self, retention_days: int) -> None:
        self._ttl = (retention_days + 1) * 86400 if retention_days else 0

    def entry(self, res: Reservation, prompt_tokens: int, completion_tokens: int, spend: Spend,
              outcome: str) -> tuple[str, str, int] | None:
        """(the list's key, the line, the list's TTL) for settle.lua to append; None while retention is off."""
        if not self._ttl:
            return None
        line = AuditRecord.of(res, prompt_tokens, completion_tokens, spend, outcome).encode()
        return rk.request_records_key(res.account_id, res.day), line, self._ttl
