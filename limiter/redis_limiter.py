"""The limiter algorithms against Redis: one Lua script call each, timed by the server's clock."""

from __future__ import annotations

from redis.asyncio import Redis

from limiter.lua import compose
from limiter.token_bucket import BucketTake
from limiter.windows import WindowCheck


class RedisLimiter:
    """Token bucket, sliding and fixed windows and concurrency leases shared by every process using one Redis.

    Scripts run with EVALSHA and fall back to EVAL on NOSCRIPT (redis-py's registered scripts).
    Give keys a hash tag (`tg:{acct:<id>}:...`) when several must live in one Cluster slot.
    """

    def __init__(self, client: Redis) -> None:
        self._client = client
        self._bucket = client.register_script(compose("limiter", "take_bucket"))
        self._window = client.register_script(compose("limiter", "hit_window"))
        self._fixed = client.register_script(compose("limiter", "count_fixed"))
        self._acquire = client.register_script(compose("limiter", "acquire_lease"))
        self._renew = client.register_script(compose("limiter", "renew_lease"))

    async def take(self, key: str, *, rate: float, burst: float, cost: float = 1.0) -> BucketTake:
        ok, tokens = await self._bucket(keys=[key], args=[rate, burst, cost])
        left = float(tokens)
        wait = 0.0 if ok else ((cost - left) / rate if cost <= burst else float("inf"))
        return BucketTake(bool(ok), left, wait)

    async def hit(self, key: str, *, limit: int, cost: int = 1, slots: int = 60) -> WindowCheck:
        """Counts `cost` in a sliding window of `slots` seconds when it fits under `limit`."""
        ok, count, wait_ms = await self._window(keys=[key], args=[limit, cost, slots])
        return WindowCheck(bool(ok), int(count), int(wait_ms) / 1000, 0.0)

    async def count(self, key: str, *, window: int, limit: int, cost: int = 1) -> WindowCheck:
        """Counts `cost` in the current fixed window of `window` seconds when it fits under `limit`."""
        ok, count, ends_ms = await self._fixed(keys=[key], args=[window, limit, cost])
        return WindowCheck(bool(ok), int(count), 0.0 if ok else int(ends_ms) / 1000, int(ends_ms) / 1000)

    async def acquire(self, key: str, member: str, *, limit: int, ttl: float) -> bool:
        return bool(await self._acquire(keys=[key], args=[member, limit, int(ttl * 1000)]))

    async def renew(self, keys: list[str], member: str, *, ttl: float) -> int:
        return int(await self._renew(keys=keys, args=[member, int(ttl * 1000)]))

    async def release(self, key: str, member: str) -> bool:
        return bool(await self._client.zrem(key, member))
