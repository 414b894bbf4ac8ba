"""Priority pools: queue in order, refuse on timeout or a full queue, free slots on every exit."""

from __future__ import annotations

import asyncio

import pytest

from config import PriorityClass
from gateway.errors import ApiError
from gateway.path.priority import PriorityPool, PriorityPools
from tests.waiting import wait_until_async


async def test_a_full_pool_queues_then_serves_in_arrival_order() -> None:
    pool = PriorityPool("realtime", PriorityClass(max_concurrency=1, queue_size=10, queue_timeout=5))
    served: list[int] = []
    release = asyncio.Event()

    async def request(i: int) -> None:
        async with pool.slot():
            served.append(i)
            if i == 0:
                await release.wait()

    tasks = [asyncio.create_task(request(i)) for i in range(5)]
    await wait_until_async(lambda: pool.queued == 4, what="four requests queued behind the first")
    assert served == [0]
    release.set()
    await asyncio.gather(*tasks)
    assert served == [0, 1, 2, 3, 4] and pool.active == 0


async def test_a_queue_timeout_is_a_503_with_retry_after() -> None:
    pool = PriorityPool("batch", PriorityClass(max_concurrency=1, queue_size=5, queue_timeout=0.1))
    await pool.acquire()
    with pytest.raises(ApiError) as refused:
        await pool.acquire()
    assert refused.value.status == 503 and refused.value.headers["retry-after"] == "1"
    assert pool.queued == 0 and pool.active == 1


async def test_a_full_queue_refuses_at_once() -> None:
    pool = PriorityPool("batch", PriorityClass(max_concurrency=1, queue_size=0, queue_timeout=10))
    await pool.acquire()
    with pytest.raises(ApiError) as refused:
        await asyncio.wait_for(pool.acquire(), 1)
    assert refused.value.code == "overloaded"


async def test_a_waiter_cancelled_in_the_queue_takes_no_slot() -> None:
    pool = PriorityPool("realtime", PriorityClass(max_concurrency=1, queue_size=5, queue_timeout=10))
    await pool.acquire()
    waiter = asyncio.create_task(pool.acquire())
    await wait_until_async(lambda: pool.queued == 1, what="the waiter in the queue")
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    pool.release()
    assert pool.active == 0 and pool.queued == 0


async def test_batch_saturation_leaves_every_realtime_slot_free() -> None:
    pools = PriorityPools({"realtime": PriorityClass(max_concurrency=2), "batch": PriorityClass(max_concurrency=1,
                          queue_size=10, queue_timeout=5)}, "realtime")
    await pools.get("batch").acquire()
    queued = [asyncio.create_task(pools.get("batch").acquire()) for _ in range(3)]
    await wait_until_async(lambda: pools.get("batch").queued == 3, what="three batch requests queued")
    # batch's queue timeout is 5 s: an acquire that waited behind it would not finish within 2 s
    await asyncio.wait_for(pools.get("realtime").acquire(), 2)
    await asyncio.wait_for(pools.get("realtime").acquire(), 2)
    assert pools.status() == {"realtime": {"active": 2, "queued": 0}, "batch": {"active": 1, "queued": 3}}
    for task in queued:
        task.cancel()
    await asyncio.gather(*queued, return_exceptions=True)


def test_an_unknown_class_name_falls_back_to_the_default() -> None:
    pools = PriorityPools({"realtime": PriorityClass()}, "realtime")
    assert pools.get("nonsense").name == "realtime" and pools.get(None).name == "realtime"
