"""The embedded store's durable half: tenancy records and the usage ledger in one SQLite file (WAL)."""

from __future__ import annotations

import json
import sqlite3
import threading
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from quota.admin_keys import AdminKey
from quota.audit import AuditQuery
from quota.calendar import month_days
from quota.catalog import UsageQuery
from quota.records import Account, ApiKey, Level, Reservation, SubAccount, UsageRow, from_json, to_json

SCHEMA = """
CREATE TABLE IF NOT EXISTS accounts (id TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS sub_accounts (id TEXT PRIMARY KEY, account_id TEXT NOT NULL, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS keys (id TEXT PRIMARY KEY, account_id TEXT NOT NULL, sub_account_id TEXT,
                                 secret_hash TEXT NOT NULL UNIQUE, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS usage (
    granularity TEXT NOT NULL, period INTEGER NOT NULL, account_id TEXT NOT NULL,
    sub_account_id TEXT NOT NULL, key_id TEXT NOT NULL, model TEXT NOT NULL,
    prompt_tokens INTEGER NOT NULL, completion_tokens INTEGER NOT NULL, requests INTEGER NOT NULL,
    PRIMARY KEY (granularity, period, account_id, sub_account_id, key_id, model));
CREATE TABLE IF NOT EXISTS key_grace (secret_hash TEXT PRIMARY KEY, key_id TEXT NOT NULL, until REAL NOT NULL);
CREATE TABLE IF NOT EXISTS admin_keys (id TEXT PRIMARY KEY, secret_hash TEXT NOT NULL UNIQUE, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS audit (seq INTEGER PRIMARY KEY AUTOINCREMENT, at REAL NOT NULL, actor TEXT NOT NULL,
                                  action TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS audit_at ON audit (at);
"""
LEVEL_COLUMN = {Level.key: "key_id", Level.sub_account: "sub_account_id", Level.account: "account_id"}


class SqliteCatalog:
    """One connection guarded by a lock: writes are tiny and the ledger write must not interleave."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _rows(self, sql: str, args: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
        with self._lock:
            return self._db.execute(sql, args).fetchall()

    def _write(self, sql: str, args: tuple[object, ...]) -> None:
        with self._lock:
            self._db.execute(sql, args)

    async def put_account(self, account: Account) -> None:
        self._write("INSERT OR REPLACE INTO accounts VALUES (?, ?)", (account.id, json.dumps(to_json(account))))

    async def get_account(self, account_id: str) -> Account | None:
        rows = self._rows("SELECT body FROM accounts WHERE id = ?", (account_id,))
        return from_json(Account, json.loads(str(rows[0][0]))) if rows else None

    async def list_accounts(self) -> list[Account]:
        return [from_json(Account, json.loads(str(r[0]))) for r in self._rows("SELECT body FROM accounts ORDER BY id")]

    async def put_sub_account(self, sub: SubAccount) -> None:
        self._write("INSERT OR REPLACE INTO sub_accounts VALUES (?, ?, ?)",
                    (sub.id, sub.account_id, json.dumps(to_json(sub))))

    async def get_sub_account(self, sub_id: str) -> SubAccount | None:
        rows = self._rows("SELECT body FROM sub_accounts WHERE id = ?", (sub_id,))
        return from_json(SubAccount, json.loads(str(rows[0][0]))) if rows else None

    async def list_sub_accounts(self, account_id: str) -> list[SubAccount]:
        rows = self._rows("SELECT body FROM sub_accounts WHERE account_id = ? ORDER BY id", (account_id,))
        return [from_json(SubAccount, json.loads(str(r[0]))) for r in rows]

    async def put_key(self, key: ApiKey, secret_hash: str | None = None) -> None:
        body = json.dumps(to_json(key))
        if secret_hash is not None:
            self._write("INSERT INTO keys VALUES (?, ?, ?, ?, ?)",
                        (key.id, key.account_id, key.sub_account_id, secret_hash, body))
        else:
            self._write("UPDATE keys SET body = ? WHERE id = ?", (body, key.id))

    async def get_key(self, key_id: str) -> ApiKey | None:
        rows = self._rows("SELECT body FROM keys WHERE id = ?", (key_id,))
        return from_json(ApiKey, json.loads(str(rows[0][0]))) if rows else None

    async def key_by_hash(self, secret_hash: str) -> ApiKey | None:
        rows = self._rows("SELECT body FROM keys WHERE secret_hash = ?", (secret_hash,))
        if not rows:  # a rotated-out secret during its grace period
            rows = self._rows("SELECT k.body FROM key_grace g JOIN keys k ON k.id = g.key_id"
                              " WHERE g.secret_hash = ? AND g.until > ?", (secret_hash, datetime.now(UTC).timestamp()))
        return from_json(ApiKey, json.loads(str(rows[0][0]))) if rows else None

    async def rotate_key(self, key: ApiKey, secret_hash: str, grace_until: datetime | None) -> None:
        """Gives the key a new secret; the old one keeps working until `grace_until` (None: not at all)."""
        with self._lock, self._db:
            self._db.execute("BEGIN")
            old = self._db.execute("SELECT secret_hash FROM keys WHERE id = ?", (key.id,)).fetchone()
            self._db.execute("UPDATE keys SET secret_hash = ?, body = ? WHERE id = ?",
                             (secret_hash, json.dumps(to_json(key)), key.id))
            self._db.execute("DELETE FROM key_grace WHERE until <= ?", (datetime.now(UTC).timestamp(),))
            if old is not None and grace_until is not None:
                self._db.execute("INSERT OR REPLACE INTO key_grace VALUES (?, ?, ?)",
                                 (old[0], key.id, grace_until.timestamp()))

    async def touch_key(self, key_id: str, when: datetime) -> None:
        # one field in place, so that a concurrent admin update is not overwritten by a stale record
        self._write("UPDATE keys SET body = json_set(body, '$.last_used_at', ?) WHERE id = ?",
                    (when.isoformat(), key_id))

    async def put_admin_key(self, key: AdminKey, secret_hash: str | None = None) -> None:
        body = json.dumps(key.to_json())
        if secret_hash is not None:
            self._write("INSERT INTO admin_keys VALUES (?, ?, ?)", (key.id, secret_hash, body))
        else:
            self._write("UPDATE admin_keys SET body = ? WHERE id = ?", (body, key.id))

    async def get_admin_key(self, key_id: str) -> AdminKey | None:
        rows = self._rows("SELECT body FROM admin_keys WHERE id = ?", (key_id,))
        return AdminKey.from_json(json.loads(str(rows[0][0]))) if rows else None

    async def admin_key_by_hash(self, secret_hash: str) -> AdminKey | None:
        rows = self._rows("SELECT body FROM admin_keys WHERE secret_hash = ?", (secret_hash,))
        return AdminKey.from_json(json.loads(str(rows[0][0]))) if rows else None

    async def list_admin_keys(self) -> list[AdminKey]:
        return [AdminKey.from_json(json.loads(str(r[0]))) for r in self._rows("SELECT body FROM admin_keys ORDER BY id")]

    async def append_audit(self, entry: dict[str, Any], keep_since: datetime) -> None:
        at = datetime.fromisoformat(entry["time"]).timestamp()
        with self._lock, self._db:
            self._db.execute("BEGIN")
            self._db.execute("INSERT INTO audit (at, actor, action, body) VALUES (?, ?, ?, ?)",
                             (at, entry["actor"], entry["action"], json.dumps(entry)))
            self._db.execute("DELETE FROM audit WHERE at < ?", (keep_since.timestamp(),))

    async def read_audit(self, query: AuditQuery) -> list[dict[str, Any]]:
        since = query.since.timestamp() if query.since else None
        rows = self._rows("SELECT body FROM audit WHERE (?1 IS NULL OR actor = ?1) AND (?2 IS NULL OR action = ?2)"
                          " AND (?3 IS NULL OR at >= ?3) ORDER BY seq DESC LIMIT ?4",
                          (query.actor, query.action, since, query.limit))
        return [json.loads(str(r[0])) for r in rows]

    async def list_keys(self, account_id: str | None, sub_account_id: str | None) -> list[ApiKey]:
        rows = self._rows(
            "SELECT body FROM keys WHERE (?1 IS NULL OR account_id = ?1) AND (?2 IS NULL OR sub_account_id = ?2)"
            " ORDER BY id", (account_id, sub_account_id))
        return [from_json(ApiKey, json.loads(str(r[0]))) for r in rows]

    def record_usage(self, reservation: Reservation, prompt_tokens: int, completion_tokens: int) -> None:
        """Adds one settled request to its hour and day rows, in one transaction."""
        res = reservation
        base = (res.account_id, res.sub_account_id or "", res.key_id, res.model,
                prompt_tokens, completion_tokens)
        with self._lock, self._db:
            self._db.execute("BEGIN")
            for granularity, period in (("hour", res.slot // 3600), ("day", res.slot // 86400)):
                self._db.execute(
                    "INSERT INTO usage VALUES (?, ?, ?, ?, ?, ?, ?, ?, 1) ON CONFLICT DO UPDATE SET"
                    " prompt_tokens = prompt_tokens + excluded.prompt_tokens,"
                    " completion_tokens = completion_tokens + excluded.completion_tokens,"
                    " requests = requests + 1", (granularity, period, *base))

    def tokens_used(self, level: Level, level_id: str, period_kind: str, period: int) -> int:
        """Settled tokens of one level in a day or a month, to seed budget counters after a restart."""
        first, last = (period, period) if period_kind == "day" else month_days(period)
        rows = self._rows(
            f"SELECT COALESCE(SUM(prompt_tokens + completion_tokens), 0) FROM usage WHERE granularity = 'day'"
            f" AND period BETWEEN ? AND ? AND {LEVEL_COLUMN[level]} = ?", (first, last, level_id))
        return int(str(rows[0][0]))

    async def usage(self, query: UsageQuery) -> list[UsageRow]:
        first, last = query.period_bounds()
        size = 3600 if query.granularity == "hour" else 86400
        rows = self._rows(
            "SELECT period, account_id, sub_account_id, key_id, model, prompt_tokens, completion_tokens, requests"
            " FROM usage WHERE granularity = ?1 AND (?2 IS NULL OR period >= ?2) AND (?3 IS NULL OR period < ?3)"
            " AND (?4 IS NULL OR account_id = ?4) AND (?5 IS NULL OR sub_account_id = ?5)"
            " AND (?6 IS NULL OR key_id = ?6) AND (?7 IS NULL OR model = ?7) ORDER BY period, key_id, model",
            (query.granularity, first, last, query.account_id, query.sub_account_id, query.key_id, query.model))
        return [UsageRow(datetime.fromtimestamp(int(str(r[0])) * size, UTC), str(r[1]), str(r[2]) or None,
                         str(r[3]), str(r[4]), int(str(r[5])), int(str(r[6])), int(str(r[7]))) for r in rows]
