"""The departure watch: work runs in the request's own task and is cancelled there once the client leaves."""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Message

from gateway.path.departure import ClientLeft, Departure


class Client:
    """An ASGI receive channel whose client leaves when told to."""

    def __init__(self) -> None:
        self.gone = asyncio.Event()

    async def receive(self) -> Message:
        await self.gone.wait()
        return {"type": "http.disconnect"}


async def test_work_that_ends_first_gives_its_result_and_leaves_the_task_uncancelled() -> None:
    client = Client()
    departure = Departure(client.receive)
    departure.start()
    assert await departure.until_left(asyncio.sleep(0, result=7)) == 7
    departure.stop()
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0


async def test_a_client_that_leaves_cancels_the_work_and_raises_client_left() -> None:
    client = Client()
    departure = Departure(client.receive)
    departure.start()
    cleaned: list[bool] = []

    async def slow() -> None:
        try:
            await asyncio.sleep(60)
        finally:
            cleaned.append(True)  # the work's own cleanup ran before ClientLeft reached the caller

    asyncio.get_running_loop().call_later(0.05, client.gone.set)
    with pytest.raises(ClientLeft):
        await asyncio.wait_for(departure.until_left(slow()), timeout=10)
    assert cleaned == [True] and departure.left
    task = asyncio.current_task()
    assert task is not None and task.cancelling() == 0  # later timeouts of the request still work


async def test_a_client_already_gone_is_told_at_once_without_starting_the_work() -> None:
    client = Client()
    client.gone.set()
    departure = Departure(client.receive)
    departure.start()
    async with asyncio.timeout(10):
        while not departure.left:
            await asyncio.sleep(0.01)
    started: list[bool] = []

    async def work() -> None:
        started.append(True)

    with pytest.raises(ClientLeft):
        await departure.until_left(work())
    assert started == []


async def test_a_cancel_from_elsewhere_stays_a_cancel() -> None:
    client = Client()
    departure = Departure(client.receive)
    departure.start()
    waiting = asyncio.create_task(departure.until_left(asyncio.sleep(60)))
    await asyncio.sleep(0.05)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    departure.stop()
