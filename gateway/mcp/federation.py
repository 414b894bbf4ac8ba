"""`/mcp`: one streamable-HTTP MCP server (the SDK's) in front of every registered server. `tools/list` shows the
calling key the tools it may use, named `server__tool`; `tools/call` goes through the gateway's call path.

Stateless: each HTTP request is served on its own, so any replica serves any request of a client's session.
The key is checked before the MCP layer sees the request: a bad one is a plain HTTP 401/403. A `tools/call` is
admitted then too, so that a call past its quota is an HTTP 429 with Retry-After (its body the JSON-RPC error).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from common.request_body import read_body, replay_body
from common.request_id import request_id as request_id_of
from gateway.auth import authenticate
from gateway.errors import ApiError
from gateway.mcp.calls import TRACE_FIELDS, AdmittedCall, CallRefused, McpCalls, ToolCall
from gateway.mcp.names import public_name
from quota import KeyInfo, QuotaService

KEY = "tidegate.key"  # where the authenticated key travels in the ASGI scope, to the MCP handlers
ADMITTED, REFUSED = "tidegate.mcp_admitted", "tidegate.mcp_refused"  # a tools/call admitted (or not) before


class McpFederation:
    def __init__(self, calls: McpCalls, quota: QuotaService, max_body_bytes: int, body_timeout: float) -> None:
        self._calls = calls
        self._quota = quota
        self._max_body_bytes = max_body_bytes
        self._body_timeout = body_timeout
        self._server: Server[Any] = Server("tidegate", version="1", on_list_tools=self._list_tools,
                                           on_call_tool=self._call_tool)
        self._sessions = StreamableHTTPSessionManager(self._server, stateless=True, json_response=True,
                                                      max_request_body_size=max_body_bytes)

    def routes(self) -> list[Route]:
        # POST only: stateless, the gateway never speaks first, so a GET stream has nothing to carry (MCP's
        # answer to it is then 405) and there is no session to DELETE
        return [Route("/mcp", _Endpoint(self), methods=["POST"])]

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The session manager's task group, for as long as the gateway serves."""
        async with self._sessions.run():
            yield

    async def serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        request = Request(scope, receive)
        request_id = request_id_of(request.headers)
        try:
            key = await authenticate(self._quota, request)
            body = None
            if request.method == "POST":
                body = await read_body(request, max_bytes=self._max_body_bytes, timeout=self._body_timeout)
        except ApiError as error:
            await error.response(request_id)(scope, receive, send)
            return
        scope[KEY] = key
        admitted = None
        if body is not None:
            receive = replay_body(body, receive)
            try:
                admitted = await self._admit_early(scope, key, body, request_id, request.headers)
            except CallRefused as refused:  # past a quota: an HTTP 429 that still carries the JSON-RPC error
                await _limited(refused, body, request_id)(scope, receive, send)
                return
        try:
            await self._sessions.handle_request(scope, receive, send)
        finally:
            if admitted is not None:  # the MCP layer refused the request before the call ran
                await self._calls.release(admitted)

    async def _admit_early(self, scope: Scope, key: KeyInfo, body: bytes, request_id: str,
                           headers: Mapping[str, str]) -> AdmittedCall | None:
        """Admits a `tools/call` before the MCP layer reads it, so that a quota refusal can be an HTTP 429 with
        Retry-After; raises CallRefused for that alone (any other refusal is answered by the call's handler)."""
        params = _call_params(body)
        if params is None:
            return None
        call = ToolCall(key, params["name"], params.get("arguments"), request_id, _trace(headers, params.get("_meta")))
        try:
            admitted = await self._calls.admit(call)
        except CallRefused as refused:
            if refused.status == 429:
                raise
            scope[REFUSED] = refused
            return None
        scope[ADMITTED] = admitted
        return admitted

    async def _list_tools(self, ctx: ServerRequestContext[Any, Any],
                          params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        listed = await self._calls.tools_for(_key(ctx))
        return types.ListToolsResult(tools=[tool.model_copy(update={"name": public_name(upstream.name, tool.name)})
                                            for upstream, tool in listed])

    async def _call_tool(self, ctx: ServerRequestContext[Any, Any],
                         params: types.CallToolRequestParams) -> types.CallToolResult:
        request = _request(ctx)
        refused: CallRefused | None = request.scope.pop(REFUSED, None)
        admitted: AdmittedCall | None = request.scope.pop(ADMITTED, None)
        try:
            if refused is not None:
                raise refused
            if admitted is not None and admitted.call.name == params.name:
                return await self._calls.run(admitted)
            call = ToolCall(_key(ctx), params.name, params.arguments, request_id_of(request.headers),
                            _trace(request.headers, ctx.meta))
            return await self._calls.call(call)
        except CallRefused as error:
            raise error.mcp_error() from None


class _Endpoint:
    """An ASGI app, so that Starlette's route hands it the raw scope (the SDK's transport reads the body)."""

    def __init__(self, federation: McpFederation) -> None:
        self._federation = federation

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._federation.serve(scope, receive, send)


def _call_params(body: bytes) -> dict[str, Any] | None:
    """The params of a single `tools/call` request in the body, when it is one with a usable name."""
    try:
        message = json.loads(body)
    except ValueError:
        return None
    if not isinstance(message, dict) or message.get("method") != "tools/call" or "id" not in message:
        return None
    params = message.get("params")
    if not isinstance(params, dict) or not isinstance(params.get("name"), str):
        return None
    arguments = params.get("arguments")
    return params if arguments is None or isinstance(arguments, dict) else None


def _trace(headers: Mapping[str, str], meta: Any) -> dict[str, str]:
    """The trace context a call continues: the HTTP request's, overridden by the call's `_meta` (MCP's place)."""
    found = {name: value for name, value in headers.items() if name in TRACE_FIELDS}
    if isinstance(meta, Mapping):
        found.update({name: value for name, value in meta.items() if name in TRACE_FIELDS and isinstance(value, str)})
    return found


def _limited(refused: CallRefused, body: bytes, request_id: str) -> Response:
    error = refused.mcp_error().error.model_dump(mode="json", exclude_none=True)
    message_id = json.loads(body).get("id")
    return JSONResponse({"jsonrpc": "2.0", "id": message_id, "error": error}, refused.status,
                        {**refused.headers, "x-request-id": request_id})


def _request(ctx: ServerRequestContext[Any, Any]) -> Request:
    request = ctx.request
    assert isinstance(request, Request), "served over HTTP only"
    return request


def _key(ctx: ServerRequestContext[Any, Any]) -> KeyInfo:
    key: KeyInfo = _request(ctx).scope[KEY]
    return key
