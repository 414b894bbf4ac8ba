"""Stored Responses API responses: the response object and the conversation's items, kept `responses_ttl_seconds`
so that a later request continues from it (`previous_response_id`) and its account can read it back.

In Redis when the gateway has one (shared by every replica, expired by Redis), else in the embedded store's SQLite
file (expired rows are dropped as new ones arrive). Responses asked with `store: false` never come here.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from config import GatewaySettings
from quota import DB_NAME, RedisClient

SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (id TEXT PRIMARY KEY, body TEXT NOT NULL, expires REAL NOT NULL);
CREATE INDEX IF NOT EXISTS responses_expires ON responses (expires);
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
    async def put(self, response_id: str, stored: StoredResponse) -> None: ...
    async def get(self, response_id: str) -> StoredResponse | None: ...
    async def delete(self, response_id: str) -> None: ...
    async def close(self) -> None: ...


def open_response_store(settings: GatewaySettings, client: RedisClient | None) -> ResponseStore:
    if client is not None:
        return RedisResponses(client, settings.responses_ttl_seconds)
    return SqliteResponses(settings.resolved_data_dir() / DB_NAME, settings.responses_ttl_seconds)


class RedisResponses:
    def __init__(self, client: RedisClient, ttl: int) -> None:
        self._r = client
        self._ttl = ttl

    async def put(self, response_id: str, stored: StoredResponse) -> None:
        await self._r.set(_key(response_id), stored.encode(), ex=self._ttl)

    async def get(self, response_id: str) -> StoredResponse | None:
        found = await self._r.get(_key(response_id))
        return None if found is None else StoredResponse.decode(found)

    async def delete(self, response_id: str) -> None:
        await self._r.delete(_key(response_id))

    async def close(self) -> None:
        pass  # the client is the gateway's, closed with it


def _key(response_id: str) -> str:
    return f"tg:response:{response_id}"


class SqliteResponses:
    def __init__(self, path: Path, ttl: int) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self._db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()
        self._ttl = ttl

    async def put(self, response_id: str, stored: StoredResponse) -> None:
        now = time.time()
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("DELETE FROM responses WHERE expires <= ?", (now,))
            self._db.execute("INSERT OR REPLACE INTO responses VALUES (?, ?, ?)",
                             (response_id, stored.encode(), now + self._ttl))

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
