"""One registered MCP server as the gateway reaches it: one MCP client session kept open and shared by its calls
(opened again when its transport breaks or the server forgets it) over a pooled HTTP client, the server's tool
list cached for `tools_ttl`, layered timeouts, one retry where nothing was sent, a breaker."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from contextlib import AsyncExitStack
from enum import StrEnum
from typing import Any, cast

import anyio
import httpx2
import mcp_types as types
from mcp import Client, MCPError
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CONNECTION_CLOSED, INVALID_REQUEST
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from config import Breaker
from config.mcp import McpServer
from gateway.channels.breaker import BreakerState, CircuitBreaker
from gateway.mcp.held import HeldSession, close_all, hold

log = logging.getLogger("tidegate.gateway.mcp")
CONNECT_RETRY_DELAY = 0.05
LIST_RETRY_DELAY = 1.0


class Failure(StrEnum):
    """Why a call got no result from its server; each is an outcome label and an MCP error."""

    timeout = "timeout"  # the server took longer than its call deadline
    unavailable = "unavailable"  # could not connect, or the connection broke
    breaker_open = "breaker_open"  # the server failed recently: no call is sent until its cooldown ends
    too_large = "result_too_large"  # the result is over the server's max_result_bytes
    server_error = "server_error"  # the server answered the call with a JSON-RPC error


class UpstreamFailure(Exception):
    def __init__(self, failure: Failure, message: str, code: int | None = None) -> None:
        super().__init__(message)
        self.failure = failure
        self.code = code  # the server's JSON-RPC error code, for a server_error


class McpUpstream:
    def __init__(self, config: McpServer, breaker: Breaker) -> None:
        self.config = config
        self.breaker = CircuitBreaker(breaker)
        self.in_flight = 0
        self._http = self._client(config)
        self._tools: list[types.Tool] = []
        self._tools_read = -float("inf")
        self._list_again_at = 0.0
        self._listing = asyncio.Lock()
        self._mode = "auto"  # how to open a session; once the server is known, its version without a probe
        self._held: HeldSession | None = None
        self._opening = asyncio.Lock()  # one session opened at a time: the calls waiting meanwhile share it
        self._sessions: set[HeldSession] = set()  # every session not yet closed, the released ones included

    @staticmethod
    def _client(config: McpServer) -> httpx2.AsyncClient:
        headers = {"authorization": f"Bearer {config.api_key}"} if config.api_key else {}
        # no read deadline of its own: the call's deadline is kept by the caller, and a request abandoned at it must
        # not fail later with a read timeout, which would break the shared session under the other calls
        timeouts = httpx2.Timeout(None, connect=config.timeouts.connect)
        return httpx2.AsyncClient(headers=headers, timeout=timeouts,
                                  limits=httpx2.Limits(max_connections=None, max_keepalive_connections=64))

    @property
    def name(self) -> str:
        return self.config.name

    def reconfigure(self, config: McpServer) -> Callable[[], Awaitable[None]] | None:
        """Takes a changed record in place (its breaker and counts stay); what closes the old session and HTTP
        client when they must go, for once the calls in flight on them are done."""
        close = None
        if (config.url, config.api_key, config.timeouts) != (self.config.url, self.config.api_key,
                                                            self.config.timeouts):
            sessions, http = set(self._sessions), self._http  # a snapshot: those opened later use the new client
            self._held, self._http = None, self._client(config)
            self._tools_read, self._mode = -float("inf"), "auto"

            async def close() -> None:
                await close_all(sessions, self.config.timeouts.connect)
                await http.aclose()
        self.config = config
        return close

    @property
    def sessions(self) -> int:
        """Client sessions open or closing (a released one stays counted until its transport is gone)."""
        return sum(not s.task.done() for s in self._sessions)

    async def close(self) -> None:
        self._held = None
        await close_all(self._sessions, self.config.timeouts.connect)
        await self._http.aclose()

    @property
    def listed(self) -> bool:
        """Whether the server's tools were ever read (else an empty list means it could not be asked)."""
        return self._tools_read > -float("inf")

    async def tools(self) -> list[types.Tool]:
        """The server's tools, read again once `tools_ttl` has passed; the last list read while it is away."""
        now = time.monotonic()
        if now - self._tools_read < self.config.tools_ttl or now < self._list_again_at:
            return self._tools
        if self.breaker.state is BreakerState.open:
            return self._tools
        async with self._listing:  # one listing at a time: the callers waiting meanwhile read its result
            if time.monotonic() - self._tools_read < self.config.tools_ttl:
                return self._tools
            try:
                with anyio.fail_after(self.config.timeouts.list):
                    # listed on the shared session, which keeps the output schemas it validates results with
                    held = await self._session()
                    try:
                        async with held.use() as client:
                            listed = await client.list_tools()
                    except BaseException as exc:
                        self._drop_after(held, exc)
                        raise
            except Exception as exc:
                # not asked again for a second, so that a server that is away costs no list timeout per call
                self._list_again_at = time.monotonic() + LIST_RETRY_DELAY
                log.warning("mcp server %s: listing its tools failed (%s)", self.name, type(exc).__name__)
                return self._tools
            self._tools, self._tools_read = list(listed.tools), time.monotonic()
        return self._tools

    async def call(self, tool: str, arguments: dict[str, Any] | None, meta: dict[str, Any]) -> types.CallToolResult:
        """The tool's result, or UpstreamFailure; a tool that reports its own error (`isError`) is a result."""
        if not self.breaker.acquire():
            raise UpstreamFailure(Failure.breaker_open, f"MCP server {self.name!r} is failing; retry shortly")
        self.in_flight += 1
        healthy: bool | None = None
        try:
            result = await self._call(tool, arguments, meta)
            healthy = True
        except UpstreamFailure as failure:
            healthy = failure.failure is Failure.server_error  # it answered: the server itself is up
            raise
        finally:
            self.in_flight -= 1
            if healthy is None:
                self.breaker.abandon()  # the caller left before any outcome
            else:
                self.breaker.record(healthy)
        size = len(result.model_dump_json(by_alias=True, exclude_none=True))
        if size > self.config.max_result_bytes:
            raise UpstreamFailure(Failure.too_large, f"the tool's result ({size} bytes) is over this server's "
                                  f"limit of {self.config.max_result_bytes} bytes")
        return result

    async def _call(self, tool: str, arguments: dict[str, Any] | None,
                    meta: dict[str, Any]) -> types.CallToolResult:
        timeouts = self.config.timeouts
        try:
            with anyio.fail_after(timeouts.call):
                return await self._call_on_session(tool, arguments, meta)
        except TimeoutError:
            raise UpstreamFailure(Failure.timeout, f"MCP server {self.name!r} did not answer within "
                                  f"{timeouts.call:g}s") from None
        except MCPError as error:
            raise UpstreamFailure(Failure.server_error, f"MCP server {self.name!r}: {error.message}",
                                  error.code) from None
        except Exception as exc:
            log.warning("mcp server %s: call failed (%s)", self.name, _cause(exc))
            raise UpstreamFailure(Failure.unavailable, f"MCP server {self.name!r} is unreachable or broke "
                                  "the connection") from None

    async def _call_on_session(self, tool: str, arguments: dict[str, Any] | None,
                               meta: dict[str, Any]) -> types.CallToolResult:
        for attempt in (1, 2):
            held = await self._session()
            try:
                async with held.use() as client:
                    return await client.call_tool(tool, arguments, meta=cast(types.RequestParamsMeta, meta or {}))
            except MCPError as error:
                if _transport_broke(error):
                    self._drop(held)
                    raise ConnectionError(error.message) from None
                # a server restarted, or that expired the session, answers 404 for it: the call never ran there,
                # so it is sent once more on a new session
                if not _session_gone(error):
                    raise
                self._drop(held)
                if attempt == 2:
                    raise
            except BaseException as exc:
                self._drop_after(held, exc)
                raise
        raise AssertionError("unreachable")

    async def _session(self) -> HeldSession:
        """The shared open session, opened first when there is none (within the caller's deadline)."""
        held = self._held
        if held is not None and held.alive:
            return held
        async with self._opening:
            held = self._held
            if held is not None and held.alive:
                return held
            if held is not None:
                self._drop(held)
            held = await hold(self.name, self._open, self.config.timeouts.call)
            self._sessions.add(held)
            held.task.add_done_callback(lambda _: self._sessions.discard(held))
            version = held.client.protocol_version
            self._mode = version if version in MODERN_PROTOCOL_VERSIONS else "legacy"
            self._held = held
            return held

    def _drop(self, held: HeldSession) -> None:
        """Releases the shared session if `held` is still it; the calls in flight on it end first."""
        if self._held is held:
            self._held = None
            held.release()

    def _drop_after(self, held: HeldSession, exc: BaseException) -> None:
        """After a request that failed or was abandoned: a broken transport drops the session, and so does an
        abandoned request on a handshake-era session, whose request goes on waiting for its answer (a modern one's
        is aborted) until the session closes."""
        if held.client.protocol_version not in MODERN_PROTOCOL_VERSIONS or not isinstance(exc, asyncio.CancelledError):
            self._drop(held)

    async def _open(self, stack: AsyncExitStack) -> Client:
        for attempt in (1, 2):
            client = Client(streamable_http_client(self.config.url, http_client=self._http, terminate_on_close=False),
                            mode=self._mode, cache=None, read_timeout_seconds=self.config.timeouts.call)
            try:
                return await stack.enter_async_context(client)
            except Exception as exc:
                # retried only when the connection was never made: nothing was sent, so nothing can run twice
                if attempt == 2 or not _refused(exc):
                    raise
                await anyio.sleep(CONNECT_RETRY_DELAY)
        raise AssertionError("unreachable")


def _session_gone(error: MCPError) -> bool:
    """Whether the server no longer knows the session: it answers 404 with an invalid-request error naming the
    session ("Session not found" from the SDK's servers; a bare 404 reaches us as "Session terminated"). An
    invalid request was refused before any tool ran, so resending it on a new session is safe."""
    return error.code == INVALID_REQUEST and "session" in error.message.lower()


def _transport_broke(error: MCPError) -> bool:
    """Whether the SDK ended the request because its connection went (the server died mid-call, say), which on a
    shared session reaches the call as an error answer rather than as the transport's exception."""
    return error.code == CONNECTION_CLOSED and (error.message == "Connection closed"
                                                or error.message.startswith("SSE stream"))


def _refused(exc: BaseException) -> bool:
    """Whether the connection was never made (so the request was never sent, and a retry is safe)."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_refused(e) for e in exc.exceptions)
    return isinstance(exc, httpx2.ConnectError | ConnectionRefusedError)


def _cause(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup):
        return ", ".join(_cause(e) for e in exc.exceptions)
    return type(exc).__name__


def arguments_size(arguments: dict[str, Any] | None) -> int:
    return len(json.dumps(arguments or {}, separators=(",", ":"), default=str))
