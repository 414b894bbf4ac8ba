"""The embedded store of Responses API responses: kept for its time to live, then gone, in the store's SQLite file."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from gateway.apis.responses.store import SqliteResponses, StoredResponse

STORED = StoredResponse("acct-1", {"id": "resp_1", "object": "response"},
                        [{"type": "message", "role": "user", "content": "Hi"}])


async def test_a_response_is_read_back_until_its_time_to_live_passes(tmp_path: Path) -> None:
    kept = SqliteResponses(tmp_path / "store.sqlite3", ttl=60)
    await kept.put("resp_1", STORED)
    assert await kept.get("resp_1") == STORED
    assert await kept.get("resp_2") is None
    await kept.close()
    lapsed = SqliteResponses(tmp_path / "store.sqlite3", ttl=0)  # same file: what it writes has expired already
    await lapsed.put("resp_3", STORED)
    assert await lapsed.get("resp_3") is None
    assert await lapsed.get("resp_1") == STORED  # written with its own, longer time to live
    await lapsed.close()


async def test_expired_rows_are_dropped_as_new_ones_arrive(tmp_path: Path) -> None:
    path = tmp_path / "store.sqlite3"
    store = SqliteResponses(path, ttl=0)
    for n in range(3):
        await store.put(f"resp_{n}", STORED)
    await store.close()
    with sqlite3.connect(path) as db:
        assert db.execute("SELECT id FROM responses").fetchall() == [("resp_2",)]  # only the newest is left
