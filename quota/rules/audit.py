"""The audit log: every admin change (who, what, before and after), appended and never rewritten."""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

from config.url_credentials import redact_url
from quota.records import InvalidRequest

SECRET_FIELDS = frozenset({"key", "secret", "api_key", "admin_key", "secret_hash", "password", "token"})
REDACTED = "[redacted]"
# a whole secret anywhere in a string (API keys tg-..., admin keys tga-...); a key's short prefix is fine
SECRET_PATTERN = re.compile(r"tga?-[A-Za-z0-9_-]{16,}")
MAX_LIMIT = 1000


@dataclass(slots=True)
class AuditEntry:
    actor: str  # the admin key's id, or "bootstrap" for the configured admin_key
    role: str
    action: str
    target: str | None
    before: Any
    after: Any
    request_id: str
    client: str | None
    time: datetime = field(default_factory=lambda: datetime.now(UTC))

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["time"] = self.time.isoformat()
        before, after = changed(self.before, self.after)
        out["before"], out["after"] = scrub(before), scrub(after)
        return out


@dataclass(slots=True)
class AuditQuery:
    actor: str | None = None
    action: str | None = None
    since: datetime | None = None
    limit: int = 100

    def matches(self, entry: dict[str, Any]) -> bool:
        return ((self.actor is None or entry.get("actor") == self.actor)
                and (self.action is None or entry.get("action") == self.action))


class AuditCatalog(Protocol):
    async def append_audit(self, entry: dict[str, Any], keep_since: datetime) -> None:
        """Appends one entry; entries older than `keep_since` may be dropped (retention)."""

    async def read_audit(self, query: AuditQuery) -> list[dict[str, Any]]:
        """Matching entries, newest first, at most `query.limit`."""


class AuditLog:
    def __init__(self, catalog: AuditCatalog, retention_seconds: float) -> None:
        self._catalog = catalog
        self._retention = retention_seconds

    async def append(self, entry: AuditEntry) -> None:
        keep_since = datetime.fromtimestamp(entry.time.timestamp() - self._retention, UTC)
        await self._catalog.append_audit(entry.to_json(), keep_since)

    async def read(self, *, actor: str | None = None, action: str | None = None, since: str | None = None,
                   limit: str | int = 100) -> list[dict[str, Any]]:
        try:
            count = int(limit)
        except ValueError:
            raise InvalidRequest("limit must be an integer") from None
        if not 1 <= count <= MAX_LIMIT:
            raise InvalidRequest(f"limit must be between 1 and {MAX_LIMIT}")
        start = None
        if since is not None:
            try:
                start = datetime.fromisoformat(since)
            except ValueError:
                raise InvalidRequest(f"since is not an ISO 8601 time: {since!r}") from None
            start = start if start.tzinfo else start.replace(tzinfo=UTC)
        return await self._catalog.read_audit(AuditQuery(actor, action, start, count))


def changed(before: Any, after: Any) -> tuple[Any, Any]:
    """Of two versions of a record, only the fields that differ (old, new), so that an entry is the size of the
    change, not of the record; a creation (nothing before) keeps the whole new record."""
    if not isinstance(before, dict) or not isinstance(after, dict):
        return before, after
    names = [n for n in {**before, **after} if before.get(n) != after.get(n)]
    return {n: before.get(n) for n in names}, {n: after.get(n) for n in names}


def scrub(value: Any) -> Any:
    """A copy with every secret removed: fields named like secrets, whole keys inside strings, URL credentials."""
    if isinstance(value, dict):
        return {k: REDACTED if k in SECRET_FIELDS and v is not None else scrub(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [scrub(v) for v in value]
    if isinstance(value, str):
        value = SECRET_PATTERN.sub(REDACTED, value)
        return redact_url(value) if "://" in value else value
    return value
