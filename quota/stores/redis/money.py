"""The Redis store's money parts: scripts composed with budget.lua, budget.lua's refusal codes, and the
per-request audit line, sent in the same batch write as its settlement (no extra round trip)."""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from limiter import libraries
from limiter.lua import read_lua
from quota.money import Spend
from quota.records import LimitName, Reservation
from quota.rules.request_audit import AuditRecord
from quota.stores.redis import keys as rk
from quota.stores.redis.client import RedisClient
from quota.stores.redis.script_batch import ScriptBatcher

MONEY_CODES = {21: LimitName.budget, 22: LimitName.balance}
AUDIT = "redis.call('RPUSH', KEYS[1], ARGV[1]) redis.call('EXPIRE', KEYS[1], ARGV[2])"


def quota_script(entry: str, clock_lua: str = "") -> str:
    """An entry script of quota/ after the limiter libraries and quota's own money library; `clock_lua`, a
    test's own `server_time`, shadows Redis TIME for the entry script only."""
    return "\n".join((libraries(), clock_lua, read_lua("quota.stores.redis", "budget"), read_lua("quota.stores.redis", entry)))


class AuditLines:
    """Appends each settled request's line to its account's list for the day; the list expires with the
    retention, so no sweeper is needed."""

    def __init__(self, client: RedisClient, batch: ScriptBatcher, retention_days: int) -> None:
        self._script = client.register_script(AUDIT)
        self._batch = batch
        self._ttl = (retention_days + 1) * 86400 if retention_days else 0

    def write(self, res: Reservation, prompt_tokens: int, completion_tokens: int, spend: Spend,
              outcome: str) -> Awaitable[Any] | None:
        if not self._ttl:
            return None
        line = AuditRecord.of(res, prompt_tokens, completion_tokens, spend, outcome).encode()
        return self._batch.call(self._script, [rk.request_records_key(res.account_id, res.day)], [line, self._ttl])
