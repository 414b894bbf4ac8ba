"""Named records of one kind in the embedded store's SQLite file, next to the tenancy and routing records."""

from __future__ import annotations

import json
import threading
from pathlib import Path

from quota.stores.embedded.private_db import connect_private
from quota.stores.record_store import Record, RecordSnapshot

SCHEMA = """
CREATE TABLE IF NOT EXISTS named_records (kind TEXT NOT NULL, name TEXT NOT NULL, body TEXT NOT NULL,
                                          PRIMARY KEY (kind, name));
CREATE TABLE IF NOT EXISTS named_records_meta (kind TEXT NOT NULL, key TEXT NOT NULL, value INTEGER NOT NULL,
                                               PRIMARY KEY (kind, key));
"""


class SqliteRecords:
    """Writes are rare and tiny; each one is a transaction that also bumps the kind's version."""

    def __init__(self, path: Path, kind: str) -> None:
        self._db = connect_private(path)
        self._db.executescript(SCHEMA)
        self._kind = kind
        self._lock = threading.Lock()

    async def version(self) -> int:
        with self._lock:
            return self._read_version()

    def _read_version(self) -> int:
        row = self._db.execute("SELECT value FROM named_records_meta WHERE kind = ? AND key = 'version'",
                               (self._kind,)).fetchone()
        return int(row[0]) if row else 0

    async def snapshot(self) -> RecordSnapshot:
        with self._lock, self._db:
            self._db.execute("BEGIN")
            version = self._read_version()
            rows = self._db.execute("SELECT name, body FROM named_records WHERE kind = ?", (self._kind,)).fetchall()
        return RecordSnapshot(version, {name: json.loads(body) for name, body in rows})

    async def seed(self, records: dict[str, Record]) -> bool:
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            if self._db.execute("SELECT 1 FROM named_records_meta WHERE kind = ? AND key = 'seeded'",
                                (self._kind,)).fetchone():
                return False
            self._db.execute("INSERT INTO named_records_meta VALUES (?, 'seeded', 1)", (self._kind,))
            self._db.executemany("INSERT OR REPLACE INTO named_records VALUES (?, ?, ?)",
                                 [(self._kind, name, json.dumps(r)) for name, r in records.items()])
            self._bump()
        return True

    async def put(self, name: str, record: Record) -> None:
        self._write("INSERT OR REPLACE INTO named_records VALUES (?, ?, ?)", (self._kind, name, json.dumps(record)))

    async def delete(self, name: str) -> None:
        self._write("DELETE FROM named_records WHERE kind = ? AND name = ?", (self._kind, name))

    def _write(self, sql: str, args: tuple[object, ...]) -> None:
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute(sql, args)
            self._bump()

    def _bump(self) -> None:
        self._db.execute("INSERT INTO named_records_meta VALUES (?, 'version', 1)"
                         " ON CONFLICT DO UPDATE SET value = value + 1", (self._kind,))

    async def close(self) -> None:
        with self._lock:
            self._db.close()
