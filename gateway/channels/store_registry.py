"""Records kept in step with a versioned store (channels, MCP servers): each replica applies the store's snapshot.

A change made through this replica is written to the store and applied here at once; other replicas see the
store's version move on their next poll. A replica whose store is down at start serves the config file's records
and seeds the store when it comes back.
"""

from __future__ import annotations

import asyncio
import logging
from abc import ABC, abstractmethod
from typing import Any, Generic, Protocol, TypeVar

from gateway.channels.periodic import Periodic


class VersionedStore(Protocol):
    async def version(self) -> int: ...
    async def snapshot(self) -> Any: ...
    async def close(self) -> None: ...


class Versioned(Protocol):
    @property
    def version(self) -> int: ...


StoreT = TypeVar("StoreT", bound=VersionedStore)
SnapshotT = TypeVar("SnapshotT", bound=Versioned)


class StoreRegistry(ABC, Generic[StoreT, SnapshotT]):
    """Seeds, reads and polls the store; a subclass says how the config file seeds it and how a snapshot applies."""

    def __init__(self, store: StoreT, what: str, log: logging.Logger, poll_name: str, poll_interval: float) -> None:
        self._store = store
        self._what = what  # in log lines: "channels", "MCP servers"
        self._log = log
        self._version = -1  # nothing read from the store yet: the config file's records serve meanwhile
        self._reloading = asyncio.Lock()  # one read applied at a time, so an older read never undoes a newer
        self._poller = Periodic(poll_name, poll_interval, self._poll, wait_first=True)

    async def start(self) -> None:
        """Seeds the store from the config file on its first start, then serves the store's records."""
        try:
            await self._seed_and_load()
        except Exception as exc:  # the store is down: serve the config file's records until it is back
            self._log.warning("cannot read %s from the store (%s); serving the config file's", self._what,
                              type(exc).__name__)
        else:
            self._loaded()
        self._poller.start()

    async def stop(self) -> None:
        await self._poller.stop()
        await self._release()
        await self._store.close()

    async def reload(self) -> None:
        async with self._reloading:
            self._take(await self._store.snapshot())

    def _take(self, snapshot: SnapshotT) -> None:
        if snapshot.version == self._version and snapshot.version >= 0:
            return
        self._apply(snapshot)
        self._version = snapshot.version

    async def _seed_and_load(self) -> None:
        await self._seed()
        await self.reload()

    async def _poll(self) -> None:
        try:
            if self._version < 0:  # the store was down at start: it may never have been seeded
                await self._seed_and_load()
            elif await self._store.version() != self._version:
                await self.reload()
        except Exception as exc:  # the store is briefly away: keep serving what was read last
            self._log.debug("%s reload skipped: %s", self._what, type(exc).__name__)

    @abstractmethod
    async def _seed(self) -> None:
        """Writes the config file's records into the store if it was never seeded."""

    @abstractmethod
    def _apply(self, snapshot: SnapshotT) -> None:
        """Makes the snapshot's records the live ones, keeping the live state of those that stay."""

    @abstractmethod
    async def _release(self) -> None:
        """Ends the live records' background work once polling has stopped, before the store closes."""

    def _loaded(self) -> None:
        """Called once the first read at start succeeded."""
