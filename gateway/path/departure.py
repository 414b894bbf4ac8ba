"""Noticing a client that leaves while its request waits (for a slot, the upstream, a whole answer): one watch per
request, which cancels the request's own task in place, instead of a task for the work and one for the watch on
every wait."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from starlette.types import Receive

from common.event_stream import wait_for_disconnect

T = TypeVar("T")


class ClientLeft(Exception):
    """The client went away before the work it waited for was done."""


class Departure:
    """Watches one request's client from `start` (after its body was read in full) until `stop`."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self._watch: asyncio.Task[None] | None = None
        self._waiting: asyncio.Task[object] | None = None  # the request's task, while inside `until_left`
        self._cancelled = False  # this watch cancelled `_waiting`
        self.left = False

    def start(self) -> None:
        self._watch = asyncio.get_running_loop().create_task(self._run())

    def stop(self) -> None:
        if self._watch is not None:
            self._watch.cancel()
            self._watch = None

    async def until_left(self, work: Awaitable[T]) -> T:
        """`work`'s result; once the client goes away first, the work is cancelled and ClientLeft raised (at once
        when it had already gone). An unexpected failure of the work is the caller's."""
        if self.left:
            if asyncio.iscoroutine(work):
                work.close()  # never started: nothing to clean up, and no "never awaited" warning
            raise ClientLeft
        task = asyncio.current_task()
        assert task is not None and self._waiting is None
        self._waiting = task
        try:
            result = await work
        except asyncio.CancelledError:
            if self._cancelled and task.uncancel() == 0:
                raise ClientLeft from None
            raise
        else:
            if self._cancelled:  # the work finished although cancelled: take the cancel back, it is done
                task.uncancel()
            return result
        finally:
            self._waiting = None
            self._cancelled = False

    async def _run(self) -> None:
        await wait_for_disconnect(self._receive)
        self.left = True
        if self._waiting is not None and not self._cancelled:
            self._cancelled = True
            self._waiting.cancel()
