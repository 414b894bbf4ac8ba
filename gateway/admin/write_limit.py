"""Admin writes per caller per minute (`admin_limits.writes_per_minute`): a fixed window per admin identity,
counted in Redis when the gateway has one (every replica together), else in this process (the embedded store
serves one process)."""

from __future__ import annotations

import time
from collections.abc import Callable

from gateway.errors import ApiError, retry_after_headers
from quota import RedisClient

WINDOW = 60


class AdminWriteLimit:
    def __init__(self, per_minute: int, redis: RedisClient | None,
                 clock: Callable[[], float] = time.time) -> None:
        self._limit = per_minute
        self._redis = redis
        self._clock = clock
        self._window = -1
        self._counts: dict[str, int] = {}

    async def hit(self, caller_id: str) -> None:
        """Counts one write by the caller; a 429 with Retry-After once its minute is spent."""
        now = self._clock()
        window = int(now // WINDOW)
        count = await self._count(caller_id, window)
        if count > self._limit:
            wait = (window + 1) * WINDOW - now
            raise ApiError(429, f"more than {self._limit} admin writes this minute by this admin key; retry after "
                           f"{wait:.0f}s", "rate_limit_exceeded", "admin_rate_limit_exceeded", None,
                           retry_after_headers(wait))

    async def _count(self, caller_id: str, window: int) -> int:
        if self._redis is not None:
            key = f"tg:admin_writes:{caller_id}:{window}"
            async with self._redis.pipeline(transaction=True) as pipe:
                pipe.incr(key)
                pipe.expire(key, WINDOW + 5)
                count, _ = await pipe.execute()
            return int(count)
        if window != self._window:
            self._window, self._counts = window, {}
        self._counts[caller_id] = self._counts.get(caller_id, 0) + 1
        return self._counts[caller_id]
