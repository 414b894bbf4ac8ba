"""Shares breaker openings between gateway replicas through Redis.

A replica whose breaker opens publishes the opening time under a key that lives for the cooldown;
every replica polls those keys once a second and opens its own breaker for the rest of the cooldown.
Half-open probes stay local: each replica tests the channel with one live request of its own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging

from gateway.channels.state import ChannelState
from limiter import REDIS_DOWN
from quota import RedisClient

log = logging.getLogger("tidegate.gateway.breakers")
PREFIX = "tidegate:{breaker}:"  # one hash tag: a sync round's reads and writes go to one Cluster node


class BreakerSync:
    def __init__(self, client: RedisClient, channels: list[ChannelState], cooldown: float, interval: float = 1.0):
        self._client = client
        self._channels = channels  # the router's own list: channels come and go at run time
        self._cooldown = cooldown
        self._interval = interval
        self._published: dict[str, int] = {}
        self._task: asyncio.Task[None] | None = None

    @staticmethod
    def _key(channel: ChannelState, model: str) -> str:
        return f"{PREFIX}{channel.name}:{model}"

    def _pairs(self) -> list[tuple[ChannelState, str]]:
        return [(c, model) for c in self._channels for model in c.config.models]

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._loop(), name="breaker-sync")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        await self._client.aclose()

    async def sync_once(self) -> None:
        """Publish local openings not yet shared, then adopt openings other replicas shared."""
        pairs = self._pairs()
        if not pairs:
            return
        pipe = self._client.pipeline(transaction=False)
        for channel, model in pairs:
            breaker, key = channel.breaker(model), self._key(channel, model)
            if breaker.opened_count > self._published.get(key, 0):
                self._published[key] = breaker.opened_count
                pipe.set(key, repr(breaker.opened_wall), px=max(1, int(self._cooldown * 1000)))
        for channel, model in pairs:  # GETs, not an MGET, which redis-py refuses in a cluster pipeline
            pipe.get(self._key(channel, model))
        results = await pipe.execute()
        for (channel, model), raw in zip(pairs, results[-len(pairs):], strict=True):
            if raw is None:
                continue
            breaker = channel.breaker(model)
            if breaker.adopt_open(float(raw)):
                self._published[self._key(channel, model)] = breaker.opened_count  # not ours to re-publish
                log.warning("breaker %s/%s opened by another replica", channel.name, model)

    async def _loop(self) -> None:
        while True:
            try:
                await self.sync_once()
            except (*REDIS_DOWN, ValueError) as exc:
                log.debug("breaker sync skipped: %s", exc)
            await asyncio.sleep(self._interval)
