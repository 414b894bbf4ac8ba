"""Per-request audit records: who asked for what and what it cost (never a prompt or an answer), one compact
line each, kept per account and UTC day for `request_records_retention_days`."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from quota.money import Spend, from_micro
from quota.records import Reservation

SEPARATOR = "|"
MAX_LISTED = 10_000


@dataclass(slots=True, frozen=True)
class AuditRecord:
    request_id: str
    at: float  # unix seconds of admission
    key_id: str
    model: str
    channel: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    cost: int  # micro-units
    outcome: str  # ok, cut, timeout, disconnected, upstream_error, ...

    def encode(self) -> str:
        """About 80 bytes: the account and the day are the list's key, so they are not repeated here."""
        request_id = self.request_id.replace(SEPARATOR, "_")[:128]
        return SEPARATOR.join((request_id, str(int(self.at)), self.key_id, self.model, self.channel,
                               str(self.prompt_tokens), str(self.cached_tokens), str(self.completion_tokens),
                               str(self.cost), self.outcome))

    @classmethod
    def decode(cls, text: str) -> AuditRecord:
        request_id, at, key_id, rest = text.split(SEPARATOR, 3)
        *names, prompt, cached, completion, cost, outcome = rest.split(SEPARATOR)
        model, channel = SEPARATOR.join(names[:-1]), names[-1]
        return cls(request_id, float(at), key_id, model, channel, int(prompt), int(cached), int(completion),
                   int(cost), outcome)

    @classmethod
    def of(cls, reservation: Reservation, prompt_tokens: int, completion_tokens: int, spend: Spend,
           outcome: str) -> AuditRecord:
        return cls(reservation.request_id, reservation.slot, reservation.key_id, reservation.model, spend.channel,
                   prompt_tokens, spend.cached_tokens, completion_tokens, spend.cost, outcome)

    def to_json(self) -> dict[str, Any]:
        return {"id": self.request_id, "at": datetime.fromtimestamp(self.at, UTC).isoformat(), "key_id": self.key_id,
                "model": self.model, "channel": self.channel or None, "prompt_tokens": self.prompt_tokens,
                "cached_tokens": self.cached_tokens, "completion_tokens": self.completion_tokens,
                "cost": from_micro(self.cost), "outcome": self.outcome}
