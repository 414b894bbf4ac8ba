"""A background poller: one coroutine run every `interval` seconds until stopped (health, breakers, throughput)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable


class Periodic:
    """Runs `work` every `interval` seconds (first after one interval when `wait_first`); `stop` cancels it."""

    def __init__(self, name: str, interval: float, work: Callable[[], Awaitable[None]], wait_first: bool = False):
        self.name = name
        self._interval = interval
        self._work = work
        self._wait_first = wait_first
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run(), name=self.name)

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _run(self) -> None:
        if self._wait_first:
            await asyncio.sleep(self._interval)
        while True:
            await self._work()
            await asyncio.sleep(self._interval)
