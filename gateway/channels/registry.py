"""Channels and model groups at run time: the store holds them, every replica applies them to its router.

A change made through this replica applies here at once; other replicas see the store's version move on their
next poll (every 250 ms). Applying a change keeps the live state (in-flight counts, breakers, health) of every
channel that stays, so no request is dropped; a removed channel's requests in flight finish on the state they hold.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, TypeVar

from pydantic import ValidationError

from config import Channel, GatewaySettings, ModelGroup
from gateway.channels.router import Router
from gateway.channels.state import ChannelState
from gateway.channels.store_registry import StoreRegistry
from quota import RoutingSnapshot, RoutingStore

log = logging.getLogger("tidegate.gateway.channels")
POLL_INTERVAL = 0.25
T = TypeVar("T", Channel, ModelGroup)


def channel_record(config: Channel) -> dict[str, Any]:
    return config.model_dump(mode="json")


class ChannelRegistry(StoreRegistry[RoutingStore, RoutingSnapshot]):
    def __init__(self, store: RoutingStore, settings: GatewaySettings, router: Router,
                 poll_interval: float = POLL_INTERVAL):
        super().__init__(store, "channels", log, "channel-registry", poll_interval)
        self._settings = settings
        self._router = router
        self._states = {c.name: c for c in router.channels}
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def router(self) -> Router:
        """The live router whose channel list this registry keeps in step with the store."""
        return self._router

    @property
    def channels(self) -> dict[str, ChannelState]:
        return dict(self._states)

    @property
    def groups(self) -> dict[str, ModelGroup]:
        return dict(self._router.groups)

    def _loaded(self) -> None:
        configured = {c.name: c for c in self._settings.channels}
        if configured != {n: s.config for n, s in self._states.items()} and configured:
            log.warning("the config file's channels differ from the store's; the store's are served "
                        "(change them with the admin API or `tidegate admin channels`)")

    async def _release(self) -> None:
        for task in list(self._tasks):  # drains under way: the store is closing under them
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def _seed(self) -> None:
        settings = self._settings
        await self._store.seed({c.name: channel_record(c) for c in settings.channels},
                               {n: g.model_dump(mode="json") for n, g in settings.model_groups.items()})

    async def put_channel(self, config: Channel) -> ChannelState:
        await self._store.put_channel(config.name, channel_record(config))
        await self.reload()
        return self._states[config.name]

    async def drain_channel(self, name: str) -> ChannelState:
        """No new requests from now on (every replica); removed from the store once this replica's are done."""
        await self._store.drain_channel(name)
        await self.reload()
        state = self._states[name]
        self._spawn(self._remove_when_idle(state), f"drain-{name}")
        return state

    async def put_group(self, name: str, group: ModelGroup) -> None:
        await self._store.put_group(name, group.model_dump(mode="json"))
        await self.reload()

    async def delete_group(self, name: str) -> None:
        await self._store.delete_group(name)
        await self.reload()

    async def _remove_when_idle(self, state: ChannelState) -> None:
        # every request in flight ends by its total deadline at the latest
        deadline = time.monotonic() + max(self._settings.timeouts.total, state.timeouts.total)
        while state.in_flight > 0 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await self._store.delete_channel(state.name)
        await self.reload()
        log.warning("channel %s drained and removed", state.name)

    def _apply(self, snapshot: RoutingSnapshot) -> None:
        states: dict[str, ChannelState] = {}
        for name, record in sorted(snapshot.channels.items()):
            config = _parsed(Channel, name, record)
            if config is None:
                continue
            state = self._states.get(name)
            timeouts = self._settings.channel_timeouts(config)
            if state is None:
                state = ChannelState(config, timeouts, self._settings.breaker)
            elif state.config != config:  # changed in place: its in-flight count and breakers stay
                state.config, state.timeouts = config, timeouts
            state.draining = name in snapshot.draining
            states[name] = state
        groups = {n: g for n, r in snapshot.groups.items() if (g := _parsed(ModelGroup, n, r)) is not None}
        for gone in set(self._states) - set(states):
            self._states[gone].draining = True  # requests still holding it must not count it as a choice
        self._states = states
        self._router.update(states.values(), groups)

    def _spawn(self, work: Any, name: str) -> None:
        task = asyncio.create_task(work, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)


def _parsed(kind: type[T], name: str, record: dict[str, Any]) -> T | None:
    try:
        return kind.model_validate(record)
    except ValidationError as exc:  # written by an older or newer gateway: skip it rather than stop routing
        log.warning("skipping stored %s %s: %d invalid fields", kind.__name__, name, exc.error_count())
        return None
