"""File and batch records and batch lines in the embedded store's SQLite file, each write one transaction."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from quota.stores.batches.store import ACTIVE, Doc, LineResult, Progress
from quota.stores.embedded.private_db import connect_private

SCHEMA = """
CREATE TABLE IF NOT EXISTS batch_files (id TEXT PRIMARY KEY, account_id TEXT NOT NULL, created_at REAL NOT NULL,
                                        body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS batch_files_account ON batch_files (account_id, created_at);
CREATE TABLE IF NOT EXISTS batches (id TEXT PRIMARY KEY, account_id TEXT NOT NULL, created_at REAL NOT NULL,
                                    status TEXT NOT NULL, body TEXT NOT NULL);
CREATE INDEX IF NOT EXISTS batches_account ON batches (account_id, created_at);
CREATE INDEX IF NOT EXISTS batches_status ON batches (status);
CREATE TABLE IF NOT EXISTS batch_lines (batch_id TEXT NOT NULL, idx INTEGER NOT NULL, free_at REAL NOT NULL,
                                        owner TEXT, PRIMARY KEY (batch_id, idx));
CREATE INDEX IF NOT EXISTS batch_lines_free ON batch_lines (batch_id, free_at);
CREATE TABLE IF NOT EXISTS batch_results (batch_id TEXT NOT NULL, idx INTEGER NOT NULL, ok INTEGER NOT NULL,
                                          line TEXT NOT NULL, PRIMARY KEY (batch_id, idx));
"""


class SqliteBatches:
    """One connection behind a lock: the dispatcher's writes are few per second and each is small."""

    def __init__(self, path: Path) -> None:
        self._db = connect_private(path)
        self._db.executescript(SCHEMA)
        self._lock = threading.Lock()

    async def put_file(self, doc: Doc) -> None:
        self._write("INSERT OR REPLACE INTO batch_files VALUES (?, ?, ?, ?)",
                    [(doc["id"], doc["account_id"], doc["created_at"], json.dumps(doc))])

    async def get_file(self, file_id: str) -> Doc | None:
        return self._one("SELECT body FROM batch_files WHERE id = ?", file_id)

    async def list_files(self, account_id: str) -> list[Doc]:
        return self._all("SELECT body FROM batch_files WHERE account_id = ? ORDER BY created_at DESC", account_id)

    async def delete_file(self, file_id: str) -> bool:
        with self._lock, self._db:
            return self._db.execute("DELETE FROM batch_files WHERE id = ?", (file_id,)).rowcount > 0

    async def create_batch(self, doc: Doc, lines: list[int], results: list[LineResult]) -> None:
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.execute("INSERT INTO batches VALUES (?, ?, ?, ?, ?)",
                             (doc["id"], doc["account_id"], doc["created_at"], doc["status"], json.dumps(doc)))
            self._db.executemany("INSERT INTO batch_lines VALUES (?, ?, 0, NULL)", [(doc["id"], i) for i in lines])
            self._db.executemany("INSERT INTO batch_results VALUES (?, ?, ?, ?)",
                                 [(doc["id"], r.index, int(r.ok), r.line) for r in results])

    async def get_batch(self, batch_id: str) -> Doc | None:
        return self._one("SELECT body FROM batches WHERE id = ?", batch_id)

    async def list_batches(self, account_id: str) -> list[Doc]:
        return self._all("SELECT body FROM batches WHERE account_id = ? ORDER BY created_at DESC", account_id)

    async def active_batches(self) -> list[Doc]:
        marks = ", ".join("?" * len(ACTIVE))
        return self._all(f"SELECT body FROM batches WHERE status IN ({marks}) ORDER BY created_at", *sorted(ACTIVE))

    async def update_batch(self, batch_id: str, expect: frozenset[str], changes: Doc) -> Doc | None:
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute("SELECT body FROM batches WHERE id = ?", (batch_id,)).fetchone()
            if row is None:
                return None
            doc = json.loads(row[0])
            if doc["status"] not in expect:
                return None
            doc.update(changes)
            self._db.execute("UPDATE batches SET status = ?, body = ? WHERE id = ?",
                             (doc["status"], json.dumps(doc), batch_id))
        return doc

    async def lease(self, batch_id: str, owner: str, count: int, seconds: float) -> list[int]:
        now = time.time()
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            free = [row[0] for row in self._db.execute(
                "SELECT idx FROM batch_lines WHERE batch_id = ? AND free_at <= ? ORDER BY idx LIMIT ?",
                (batch_id, now, count))]
            self._db.executemany("UPDATE batch_lines SET free_at = ?, owner = ? WHERE batch_id = ? AND idx = ?",
                                 [(now + seconds, owner, batch_id, i) for i in free])
        return free

    async def renew(self, batch_id: str, owner: str, indexes: list[int], seconds: float) -> None:
        self._write("UPDATE batch_lines SET free_at = ? WHERE batch_id = ? AND idx = ? AND owner = ?",
                    [(time.time() + seconds, batch_id, i, owner) for i in indexes])

    async def postpone(self, batch_id: str, owner: str, index: int, seconds: float) -> None:
        self._write("UPDATE batch_lines SET free_at = ?, owner = NULL WHERE batch_id = ? AND idx = ? AND owner = ?",
                    [(time.time() + seconds, batch_id, index, owner)])

    async def record(self, result: LineResult, batch_id: str) -> bool:
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            added = self._db.execute("INSERT OR IGNORE INTO batch_results VALUES (?, ?, ?, ?)",
                                     (batch_id, result.index, int(result.ok), result.line)).rowcount > 0
            self._db.execute("DELETE FROM batch_lines WHERE batch_id = ? AND idx = ?", (batch_id, result.index))
        return added

    async def progress(self, batch_id: str) -> Progress:
        with self._lock:
            unfinished, running = self._db.execute(
                "SELECT COUNT(*), COALESCE(SUM(owner IS NOT NULL AND free_at > ?), 0) FROM batch_lines"
                " WHERE batch_id = ?", (time.time(), batch_id)).fetchone()
            completed, failed = self._db.execute(
                "SELECT COALESCE(SUM(ok), 0), COALESCE(SUM(1 - ok), 0) FROM batch_results WHERE batch_id = ?",
                (batch_id,)).fetchone()
        return Progress(unfinished, running, completed, failed)

    async def unfinished(self, batch_id: str) -> list[int]:
        with self._lock:
            return [row[0] for row in self._db.execute(
                "SELECT idx FROM batch_lines WHERE batch_id = ? ORDER BY idx", (batch_id,))]

    async def results(self, batch_id: str) -> list[LineResult]:
        with self._lock:
            rows = self._db.execute("SELECT idx, ok, line FROM batch_results WHERE batch_id = ? ORDER BY idx",
                                    (batch_id,)).fetchall()
        return [LineResult(i, bool(ok), line) for i, ok, line in rows]

    async def close(self) -> None:
        with self._lock:
            self._db.close()

    def _write(self, sql: str, rows: Iterable[tuple[Any, ...]]) -> None:
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            self._db.executemany(sql, rows)

    def _one(self, sql: str, *args: object) -> Doc | None:
        with self._lock:
            row = self._db.execute(sql, args).fetchone()
        return None if row is None else dict(json.loads(row[0]))

    def _all(self, sql: str, *args: object) -> list[Doc]:
        with self._lock:
            return [json.loads(row[0]) for row in self._db.execute(sql, args).fetchall()]
