"""An MCP client session kept open across tool calls: one handshake and one tool listing per session instead of
per call, so that a relayed call costs the server one request."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import anyio
from mcp import Client

log = logging.getLogger("tidegate.gateway.mcp")

Opener = Callable[[AsyncExitStack], Awaitable[Client]]


class HeldSession:
    """An open client whose transport lives in a task of its own: the SDK's transport runs anyio task groups, whose
    scopes must be left by the task that entered them, so no caller's task may own it."""

    def __init__(self, client: Client, stop: asyncio.Event, idle: asyncio.Event, task: asyncio.Task[None]) -> None:
        self.client = client
        self._stop = stop
        self._idle = idle
        self._calls = 0
        self.task = task

    @asynccontextmanager
    async def use(self) -> AsyncIterator[Client]:
        """The client, counted as in use until the block ends (a released session closes once none is)."""
        self._calls += 1
        self._idle.clear()
        try:
            yield self.client
        finally:
            self._calls -= 1
            if self._calls == 0:
                self._idle.set()

    @property
    def alive(self) -> bool:
        return not self._stop.is_set() and not self.task.done()

    def release(self) -> None:
        """Takes no more calls, and closes once the calls on it have ended (or `drain` seconds have passed)."""
        self._stop.set()


async def hold(name: str, open_client: Opener, drain: float) -> HeldSession:
    """Opens a session in its own task; the opener's error when it cannot, and nothing left behind."""
    loop = asyncio.get_running_loop()
    ready: asyncio.Future[Client] = loop.create_future()
    stop, idle = asyncio.Event(), asyncio.Event()
    idle.set()

    async def keep() -> None:
        try:
            async with AsyncExitStack() as stack:
                client = await open_client(stack)
                if ready.done():  # whoever asked gave up meanwhile
                    return
                ready.set_result(client)
                await stop.wait()
                with anyio.move_on_after(drain):
                    await idle.wait()
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            else:  # the transport broke under a held session: the call that meets it drops the session
                log.debug("mcp server %s: session ended (%s)", name, type(exc).__name__)

    task = loop.create_task(keep(), name=f"mcp-session-{name}")
    try:
        client = await asyncio.shield(ready)
    except asyncio.CancelledError:
        # the caller's deadline: the opening is abandoned, not awaited (a cancelled scope would cancel the wait too)
        ready.cancel()
        task.cancel()
        raise
    return HeldSession(client, stop, idle, task)


async def close_all(sessions: set[HeldSession], grace: float) -> None:
    """Releases every session and waits for their tasks, cancelling those still closing after `grace` seconds."""
    for session in sessions:
        session.release()
    tasks = [s.task for s in sessions]
    if not tasks:
        return
    _, late = await asyncio.wait(tasks, timeout=grace)
    for task in late:
        task.cancel()
    await asyncio.gather(*late, return_exceptions=True)
