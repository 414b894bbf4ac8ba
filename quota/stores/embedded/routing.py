"""Channel and model-group records in the embedded store's SQLite file, next to the tenancy records."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from quota.stores.embedded.private_db import connect_private
from quota.stores.routing_store import Record, RoutingSnapshot

SCHEMA = """
CREATE TABLE IF NOT EXISTS routing_channels (name TEXT PRIMARY KEY, body TEXT NOT NULL,
                                             draining INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS routing_groups (name TEXT PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS routing_meta (key TEXT PRIMARY KEY, value INTEGER NOT NULL);
"""


class SqliteRouting:
    """Writes are rare and tiny; each one is a transaction that also bumps the version."""

    def __init__(self, path: Path) -> None:
        self._db = connect_private(path)
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    async def version(self) -> int:
        with self._lock:
            row = self._db.execute("SELECT value FROM routing_meta WHERE key = 'version'").fetchone()
        return int(row[0]) if row else 0

    async def snapshot(self) -> RoutingSnapshot:
        with self._lock, self._db:
            self._db.execute("BEGIN")
            row = self._db.execute("SELECT value FROM routing_meta WHERE key = 'version'").fetchone()
            channels = self._db.execute("SELECT name, body, draining FROM routing_channels").fetchall()
            groups = self._db.execute("SELECT name, body FROM routing_groups").fetchall()
        return RoutingSnapshot(int(row[0]) if row else 0, {n: json.loads(b) for n, b, _ in channels},
                               {n for n, _, d in channels if d}, {n: json.loads(b) for n, b in groups})

    async def seed(self, channels: dict[str, Record], groups: dict[str, Record]) -> bool:
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            if self._db.execute("SELECT 1 FROM routing_meta WHERE key = 'seeded'").fetchone():
                return False
            self._db.execute("INSERT INTO routing_meta VALUES ('seeded', 1)")
            self._db.executemany("INSERT OR REPLACE INTO routing_channels VALUES (?, ?, 0)",
                                 [(n, json.dumps(r)) for n, r in channels.items()])
            self._db.executemany("INSERT OR REPLACE INTO routing_groups VALUES (?, ?)",
                                 [(n, json.dumps(r)) for n, r in groups.items()])
            self._bump()
        return True

    async def put_channel(self, name: str, record: Record) -> None:
        self._write("INSERT OR REPLACE INTO routing_channels VALUES (?, ?, 0)", (name, json.dumps(record)))

    async def drain_channel(self, name: str) -> None:
        self._write("UPDATE routing_channels SET draining = 1 WHERE name = ?", (name,))

    async def delete_channel(self, name: str) -> None:
        self._write("DELETE FROM routing_channels WHERE name = ?", (name,))

    async def put_group(self, name: str, record: Record) -> None:
        self._write("INSERT OR REPLACE INTO routing_groups VALUES (?, ?)", (name, json.dumps(record)))

    async def delete_group(self, name: str) -> None:
        self._write("DELETE FROM routing_groups WHERE name = ?", (name,))

    def _write(self, sql: str, args: tuple[object, ...]) -> None:
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(sql, args)
            self._bump()

    def _bump(self) -> None:
        self._db.execute("INSERT INTO routing_meta VALUES ('version', 1)"
                         " ON CONFLICT DO UPDATE SET value = value + 1")

    async def close(self) -> None:
        with self._lock:
            self._db.close()
