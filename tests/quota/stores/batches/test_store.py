"""The batch store, embedded and on a real redis-server: leases that two replicas never share, leases that lapse
so a dead replica's lines are taken over, a result recorded once, and status changes that only one caller wins."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from config import StoreSettings
from quota import BatchStore, LineResult, open_batch_store
from tests.redis_cluster import RedisClusterServers
from tests.servers import RedisServer
from tests.waiting import wait_until_async

ACTIVE = frozenset({"in_progress"})


@pytest.fixture(params=["embedded", "redis_server", "redis_cluster"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[BatchStore]:
    """The embedded store, one redis-server, and a Redis Cluster (every script and transaction in one slot)."""
    settings = StoreSettings(data_dir=tmp_path / "data")
    if request.param != "embedded":
        server: RedisServer | RedisClusterServers = request.getfixturevalue(request.param)
        settings = StoreSettings(data_dir=tmp_path / "data", redis_url=server.url)
    opened = open_batch_store(settings)
    yield opened
    await opened.close()


def batch(batch_id: str, account: str = "acct-1", created: int = 1) -> dict[str, Any]:
    return {"id": batch_id, "account_id": account, "created_at": created, "status": "in_progress"}


async def test_two_replicas_never_lease_one_line_twice(store: BatchStore) -> None:
    await store.create_batch(batch("b1"), list(range(50)), [])
    first, second = await asyncio.gather(*(store.lease("b1", owner, 30, 30) for owner in ("r1", "r2")))
    assert sorted(first + second) == list(range(50))
    assert not set(first) & set(second)
    assert await store.lease("b1", "r3", 10, 30) == []
    progress = await store.progress("b1")
    assert (progress.unfinished, progress.running) == (50, 50)


async def test_a_lapsed_lease_is_taken_over_and_a_renewed_one_is_not(store: BatchStore) -> None:
    await store.create_batch(batch("b2"), [0, 1], [])
    assert await store.lease("b2", "dead", 1, 1) == [0]
    assert await store.lease("b2", "alive", 1, 1) == [1]
    await store.renew("b2", "alive", [1], 60)
    # the replica that never renews loses its line once the lease lapses; the renewed one stays put
    taken: list[int] = []

    async def taken_over() -> bool:
        taken.extend(await store.lease("b2", "heir", 2, 30))
        return bool(taken)

    await wait_until_async(taken_over, timeout=10)
    assert taken == [0]


async def test_a_result_is_recorded_once_and_ends_the_lines_lease(store: BatchStore) -> None:
    await store.create_batch(batch("b3"), [0, 1], [LineResult(2, False, '{"bad": 2}')])
    leased = await store.lease("b3", "r1", 2, 30)
    assert await store.record(LineResult(0, True, '{"first": 0}'), "b3")
    assert not await store.record(LineResult(0, True, '{"again": 0}'), "b3")
    await store.postpone("b3", "r1", 1, 0)
    assert leased == [0, 1]
    assert await store.unfinished("b3") == [1]
    assert await store.lease("b3", "r2", 5, 30) == [1]
    assert await store.record(LineResult(1, False, '{"err": 1}'), "b3")
    progress = await store.progress("b3")
    assert (progress.unfinished, progress.completed, progress.failed) == (0, 1, 2)
    assert await store.results("b3") == [LineResult(0, True, '{"first": 0}'), LineResult(1, False, '{"err": 1}'),
                                          LineResult(2, False, '{"bad": 2}')]


async def test_only_one_caller_wins_a_status_change(store: BatchStore) -> None:
    await store.create_batch(batch("b4"), [], [])
    wins = await asyncio.gather(*(store.update_batch("b4", ACTIVE, {"status": "finalizing", "by": who})
                                  for who in ("r1", "r2", "r3")))
    assert sum(w is not None for w in wins) == 1
    record = await store.get_batch("b4")
    assert record is not None and record["status"] == "finalizing"
    assert [b["id"] for b in await store.active_batches()] == ["b4"]
    assert await store.update_batch("b4", frozenset({"finalizing"}), {"status": "completed"}) is not None
    assert await store.active_batches() == []


async def test_records_are_listed_per_account_newest_first(store: BatchStore) -> None:
    for i, account in enumerate(["a", "b", "a"]):
        await store.put_file({"id": f"file-{i}", "account_id": account, "created_at": i})
        await store.create_batch(batch(f"batch-{i}", account, i), [], [])
    assert [f["id"] for f in await store.list_files("a")] == ["file-2", "file-0"]
    assert [b["id"] for b in await store.list_batches("a")] == ["batch-2", "batch-0"]
    assert await store.delete_file("file-0") and not await store.delete_file("file-0")
    assert await store.get_file("file-0") is None
    assert [f["id"] for f in await store.list_files("a")] == ["file-2"]
