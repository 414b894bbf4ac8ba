"""Stored Responses API responses: the response object and the conversation's items, kept `responses_ttl_seconds`
so that a later request continues from it (`previous_response_id`) and its account can read it back.

In Redis when the gateway has one (shared by every replica, expired by Redis), else in the embedded store's SQLite
file (expired rows are dropped as new ones arrive). Responses asked with `store: false` never come here. Each
account may keep at most `responses_max_stored_bytes_per_account`: a response past it is not stored.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from config import GatewaySettings
from quota import DB_NAME, RedisClient, connect_private

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, body TEXT NOT NULL, expires REAL NOT NULL,
                                      account_id TEXT NOT NULL DEFAULT '', size INTEGER NOT NULL DEFAULT 0);
CREATE INDEX IF NOT EXISTS responses_expires ON responses (expires);
"""
DEFAULT_CAP = 64 * 1024 * 1024  # the setting's default, for stores opened without settings
ACCOUNTED = "ALTER TABLE responses ADD COLUMN {column}"  # a table from before the per-account cap
# one account's stored responses as "id|bytes" members scored by their expiry (ms): dropped when expired, summed
# against the cap, and the new one added only when it fits. ARGV: now, id, bytes (0: only sum), cap, expiry, ttl
ACCOUNT_BYTES = """
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ARGV[1])
local used = 0
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  used = used + tonumber(string.match(member, '|(%d+)$'))
end
local size = tonumber(ARGV[3])
if size == 0 then return used end
if used + size > tonumber(ARGV[4]) then return -1 end
redis.call('ZADD', KEYS[1], ARGV[5], ARGV[2] .. '|' .. ARGV[3])
redis.call('PEXPIRE', KEYS[1], ARGV[6])
return used + size
"""


@dataclass(slots=True)
class StoredResponse:
    account_id: str  # only keys of this account may read or continue it
    response: dict[str, Any]
    items: list[dict[str, Any]]  # the conversation up to and including this response's output, as input items

    def encode(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def decode(cls, text: str | bytes) -> StoredResponse:
        return cls(**json.loads(text))


class ResponseStore(Protocol):
    cap: int  # bytes per account

    async def put(self, response_id: str, stored: StoredResponse) -> bool:
        """Stores it unless its account's stored bytes would pass the cap; False when it did not."""

    async def used(self, account_id: str) -> int:
        """The bytes the account's unexpired responses take."""

    async def get(self, response_id: str) -> StoredResponse | None: ...
    async def delete(self, response_id: str) -> None: ...
    async def close(self) -> None: ...


def open_response_store(settings: GatewaySettings, client: RedisClient | None) -> ResponseStore:
    if client is not None:
        return RedisResponses(client, settings.responses_ttl_seconds, settings.responses_max_stored_bytes_per_account)
    return SqliteResponses(settings.resolved_data_dir() / DB_NAME, settings.responses_ttl_seconds,
                           settings.responses_max_stored_bytes_per_account)


class RedisResponses:
    def __init__(self, client: RedisClient, ttl: int, cap: int = DEFAULT_CAP) -> None:
        self._r = client
        self._ttl = ttl
        self.cap = cap
        self._account_bytes = client.register_script(ACCOUNT_BYTES)

    async def _count(self, account_id: str, response_id: str, size: int) -> int:
        now = int(time.time() * 1000)
        return int(await self._account_bytes(keys=[_account_key(account_id)],
                                             args=[now, response_id, size, self.cap, now + self._ttl * 1000,
                                                   self._ttl * 1000]))

    async def put(self, response_id: str, stored: StoredResponse) -> bool:
        text = stored.encode()
        if await self._count(stored.account_id, response_id, len(text)) < 0:
            return False
        await self._r.set(_key(response_id), text, ex=self._ttl)
        return True

    async def used(self, account_id: str) -> int:
        return await self._count(account_id, "", 0)

    async def get(self, response_id: str) -> StoredResponse | None:
        found = await self._r.get(_key(response_id))
        return None if found is None else StoredResponse.decode(found)

    async def delete(self, response_id: str) -> None:
        found = await self._r.get(_key(response_id))
        if found is not None:
            text = found.decode() if isinstance(found, bytes) else str(found)
            account = StoredResponse.decode(text).account_id
            await self._r.zrem(_account_key(account), f"{response_id}|{len(text)}")
        await self._r.delete(_key(response_id))

    async def close(self) -> None:
        pass  # the client is the gateway's, closed with it


def _key(response_id: str) -> str:
    return f"tg:response:{response_id}"


def _account_key(account_id: str) -> str:
    return f"tg:{{acct:{account_id}}}:responses"


class SqliteResponses:
    def __init__(self, path: Path, ttl: int, cap: int = DEFAULT_CAP) -> None:
        self._db = connect_private(path)
        self._db.executescript(SCHEMA)
        columns = {str(r[1]) for r in self._db.execute("PRAGMA table_info(responses)").fetchall()}
        for column in ("account_id TEXT NOT NULL DEFAULT ''", "size INTEGER NOT NULL DEFAULT 0"):
            if column.split()[0] not in columns:
                self._db.execute(ACCOUNTED.format(column=column))
        self._db.execute("CREATE INDEX IF NOT EXISTS responses_account ON responses (account_id)")
        self._lock = threading.Lock()
        self._ttl = ttl
        self.cap = cap

    def _used(self, account_id: str, now: float) -> int:
        row = self._db.execute("SELECT COALESCE(SUM(size), 0) FROM responses WHERE account_id = ? AND expires > ?",
                               (account_id, now)).fetchone()
        return int(row[0])

    async def put(self, response_id: str, stored: StoredResponse) -> bool:
        now, text = time.time(), stored.encode()
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM responses WHERE expires <= ?", (now,))
            if self._used(stored.account_id, now) + len(text) > self.cap:
                return False
            self._db.execute("INSERT OR REPLACE INTO responses (id, body, expires, account_id, size)"
                             " VALUES (?, ?, ?, ?, ?)", (response_id, text, now + self._ttl, stored.account_id,
                                                         len(text)))
        return True

    async def used(self, account_id: str) -> int:
        with self._lock:
            return self._used(account_id, time.time())

    async def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            row = self._db.execute("SELECT body FROM responses WHERE id = ? AND expires > ?",
                                   (response_id, time.time())).fetchone()
        return None if row is None else StoredResponse.decode(row[0])

    async def delete(self, response_id: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,))

    async def close(self) -> None:
        with self._lock:
            self._db.close()
