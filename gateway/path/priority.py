"""Priority classes: each has its own concurrency pool and a bounded FIFO queue with a timeout.

Pools are separate, so `batch` can never take the last slots of `realtime`. A slot is handed from
the finishing request straight to the head of the queue, which keeps the queue's order.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator

from config import PriorityClass
from gateway.errors import ApiError, unavailable


class PriorityPool:
    """One class's pool: `max_concurrency` slots, then up to `queue_size` waiters for `queue_timeout`."""

    def __init__(self, name: str, settings: PriorityClass, rank: int = 0):
        self.name = name
        self.settings = settings
        self.rank = rank  # position in the configured list: 0 is the most important class
        self.active = 0
        self._waiters: deque[asyncio.Future[None]] = deque()
        # (when, seconds from arrival to first token) of the latest requests: what the batch dispatcher yields to
        self.first_tokens: deque[tuple[float, float]] = deque(maxlen=512)

    @property
    def queued(self) -> int:
        return len(self._waiters)

    async def acquire(self) -> None:
        """Take a slot, waiting in line if the pool is full; raises a 503 ApiError when it cannot."""
        if self.active < self.settings.max_concurrency and not self._waiters:
            self.active += 1
            return
        if len(self._waiters) >= self.settings.queue_size:
            raise self._refusal(f"the {self.name!r} queue is full")
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await asyncio.wait_for(asyncio.shield(waiter), self.settings.queue_timeout)
        except TimeoutError:
            if not self._forget(waiter):
                return  # handed a slot at the very moment the timeout fired: keep it
            raise self._refusal(f"waited {self.settings.queue_timeout}s in the {self.name!r} queue") from None
        except asyncio.CancelledError:
            if not self._forget(waiter):
                self.release()  # the client left holding a slot it was just given
            raise

    def note_first_token(self, seconds: float) -> None:
        self.first_tokens.append((time.monotonic(), seconds))

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)  # the slot passes on; `active` stays the same
                return
        self.active -= 1

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self.acquire()
        try:
            yield
        finally:
            self.release()

    def _forget(self, waiter: asyncio.Future[None]) -> bool:
        """Drop a waiter that gave up; False when it had already been handed a slot."""
        if waiter.done():
            return False
        waiter.cancel()
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)
        return True

    def _refusal(self, why: str) -> ApiError:
        return unavailable(f"overloaded: {why}; retry later", retry_after=self.settings.queue_timeout,
                           code="overloaded")


class PriorityPools:
    """The configured classes by name."""

    def __init__(self, classes: dict[str, PriorityClass], default: str):
        self.pools = {name: PriorityPool(name, settings, rank) for rank, (name, settings) in enumerate(classes.items())}
        self.default = default

    def get(self, name: str | None) -> PriorityPool:
        # a stored class that is not (or no longer) configured falls back to the default, never to a 500
        return self.pools[name if isinstance(name, str) and name in self.pools else self.default]

    def choose(self, ceiling: str | None, asked: str | None, account_ceiling: str | None = None) -> PriorityPool:
        """The class the body asked for when it is no more important than the key's class (or the default
        class, for a key without one) and its account's ceiling; otherwise the lower of those ceilings."""
        top = self.get(ceiling)
        if account_ceiling in self.pools and self.pools[account_ceiling].rank > top.rank:
            top = self.pools[account_ceiling]
        wanted = self.pools.get(asked) if asked is not None else None
        return wanted if wanted is not None and wanted.rank >= top.rank else top

    def status(self) -> dict[str, dict[str, int]]:
        return {name: {"active": p.active, "queued": p.queued} for name, p in self.pools.items()}
