"""MCP servers at run time: the store holds their records, every replica keeps an upstream per server.

Like channels (gateway/channels/registry.py): a change made through this replica applies here at once; other
replicas see the store's version move on their next poll (every 250 ms). A server that stays keeps its breaker
and pooled connections (and its session, unless its URL, key or timeouts changed); a removed one's calls in
flight finish on the upstream they hold.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import ValidationError

from config import Breaker
from config.mcp import McpServer
from gateway.channels.store_registry import StoreRegistry
from gateway.mcp.names import every_tool
from gateway.mcp.upstream import McpUpstream
from quota import RecordSnapshot, RecordStore

log = logging.getLogger("tidegate.gateway.mcp")
POLL_INTERVAL = 0.25
KIND = "mcp_servers"
# writes the per-call price of a server's tools: (price name, currency units per call)
SetPrice = Callable[[str, float], Awaitable[None]]


def server_record(config: McpServer) -> dict[str, Any]:
    return config.model_dump(mode="json", exclude={"api_key_file"})


class McpRegistry(StoreRegistry[RecordStore, RecordSnapshot]):
    def __init__(self, store: RecordStore, configured: list[McpServer], breaker: Breaker, set_price: SetPrice,
                 poll_interval: float = POLL_INTERVAL) -> None:
        super().__init__(store, "MCP servers", log, "mcp-registry", poll_interval)
        self._configured = configured
        self._breaker = breaker
        self._set_price = set_price
        self._servers: dict[str, McpUpstream] = {}
        self._closing: set[asyncio.Task[None]] = set()
        self._take(RecordSnapshot(-1, {c.name: server_record(c) for c in configured}))

    @property
    def servers(self) -> dict[str, McpUpstream]:
        return dict(self._servers)

    async def put(self, config: McpServer) -> McpUpstream:
        if config.price_per_call is not None:
            await self._set_price(every_tool(config.name), config.price_per_call)
        await self._store.put(config.name, server_record(config))
        await self.reload()
        return self._servers[config.name]

    async def delete(self, name: str) -> None:
        await self._store.delete(name)
        await self.reload()

    async def _seed(self) -> None:
        configured = {c.name: server_record(c) for c in self._configured}
        if await self._store.seed(configured):
            for config in self._configured:
                if config.price_per_call is not None:
                    await self._set_price(every_tool(config.name), config.price_per_call)

    async def _release(self) -> None:
        await asyncio.gather(*(s.close() for s in self._servers.values()), *self._closing, return_exceptions=True)

    def _apply(self, snapshot: RecordSnapshot) -> None:
        servers: dict[str, McpUpstream] = {}
        for name, record in sorted(snapshot.records.items()):
            try:
                config = McpServer.model_validate(record)
            except ValidationError as exc:  # written by an older or newer gateway: skip it, serve the others
                log.warning("skipping stored MCP server %s: %d invalid fields", name, exc.error_count())
                continue
            upstream = self._servers.get(name)
            if upstream is None:
                upstream = McpUpstream(config, self._breaker)
            elif upstream.config != config:
                close = upstream.reconfigure(config)
                if close is not None:
                    self._close_later(upstream, close)
            servers[name] = upstream
        for gone in set(self._servers) - set(servers):
            self._close_later(self._servers[gone], self._servers[gone].close)
        self._servers = servers

    def _close_later(self, upstream: McpUpstream, close: Callable[[], Awaitable[None]]) -> None:
        """Closes a removed server's (or a replaced) sessions and HTTP client once its calls in flight are done."""
        task = asyncio.get_running_loop().create_task(_close_when_idle(upstream, close))
        self._closing.add(task)
        task.add_done_callback(self._closing.discard)


async def _close_when_idle(upstream: McpUpstream, close: Callable[[], Awaitable[None]]) -> None:
    deadline = time.monotonic() + upstream.config.timeouts.call  # every call ends by then
    while upstream.in_flight > 0 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    await close()
