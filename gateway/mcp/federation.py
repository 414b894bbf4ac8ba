"""`/mcp`: one streamable-HTTP MCP server (the SDK's) in front of every registered server. `tools/list` shows the
calling key the tools it may use, named `server__tool`; `tools/call` goes through the gateway's call path.

Stateless: each HTTP request is served on its own, so any replica serves any request of a client's session.
The key is checked before the MCP layer sees the request: a bad one is a plain HTTP 401/403.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from common.request_id import request_id as request_id_of
from gateway.auth import authenticate
from gateway.errors import ApiError
from gateway.mcp.calls import TRACE_FIELDS, CallRefused, McpCalls, ToolCall
from gateway.mcp.names import public_name
from quota import KeyInfo, QuotaService

KEY = "tidegate.key"  # where the authenticated key travels in the ASGI scope, to the MCP handlers


class McpFederation:
    def __init__(self, calls: McpCalls, quota: QuotaService, max_body_bytes: int) -> None:
        self._calls = calls
        self._quota = quota
        self._server: Server[Any] = Server("tidegate", version="1", on_list_tools=self._list_tools,
                                           on_call_tool=self._call_tool)
        self._sessions = StreamableHTTPSessionManager(self._server, stateless=True, json_response=True,
                                                      max_request_body_size=max_body_bytes)

    def routes(self) -> list[Route]:
        return [Route("/mcp", _Endpoint(self), methods=["GET", "POST", "DELETE"])]

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The session manager's task group, for as long as the gateway serves."""
        async with self._sessions.run():
            yield

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        try:
            scope[KEY] = await authenticate(self._quota, request)
        except ApiError as error:
            await error.response(request_id_of(request.headers))(scope, receive, send)
            return
        await self._sessions.handle_request(scope, receive, send)

    async def _list_tools(self, ctx: ServerRequestContext[Any, Any],
                          params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        listed = await self._calls.tools_for(_key(ctx))
        return types.ListToolsResult(tools=[tool.model_copy(update={"name": public_name(upstream.name, tool.name)})
                                            for upstream, tool in listed])

    async def _call_tool(self, ctx: ServerRequestContext[Any, Any],
                         params: types.CallToolRequestParams) -> types.CallToolResult:
        request = _request(ctx)
        headers = {name: value for name, value in request.headers.items() if name in TRACE_FIELDS}
        # MCP carries trace context in the call's _meta; it wins over the HTTP request's
        headers.update({name: value for name, value in (ctx.meta or {}).items()
                        if name in TRACE_FIELDS and isinstance(value, str)})
        call = ToolCall(_key(ctx), params.name, params.arguments, request_id_of(request.headers), headers)
        try:
            return await self._calls.call(call)
        except CallRefused as refused:
            raise refused.mcp_error() from None


class _Endpoint:
    """An ASGI app, so that Starlette's route hands it the raw scope (the SDK's transport reads the body)."""

    def __init__(self, federation: McpFederation) -> None:
        self._federation = federation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._federation.serve(scope, receive, send)


def _request(ctx: ServerRequestContext[Any, Any]) -> Request:
    request = ctx.request
    assert isinstance(request, Request), "served over HTTP only"
    return request


def _key(ctx: ServerRequestContext[Any, Any]) -> KeyInfo:
    key: KeyInfo = _request(ctx).scope[KEY]
    return key
