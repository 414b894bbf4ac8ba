"""A real MCP server written with the SDK, for the gateway's MCP tests and benchmark: run as
`python -m tests.gateway.mcp.tool_server NAME PORT [BEARER]` (with BEARER, calls without it are refused; with
TOOL_SERVER_STATEFUL=1 in its environment it speaks only the handshake era: initialize, then session ids, which
a restart forgets)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

import mcp_types as types
import uvicorn
from mcp.server.context import ServerRequestContext
from mcp.server.lowlevel.server import Server
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

TOOLS = [
    types.Tool(name="echo", description="Answers its text", input_schema={
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}),
    types.Tool(name="add", description="Adds two numbers", input_schema={
        "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}),
    types.Tool(name="sleep", description="Answers after some seconds", input_schema={
        "type": "object", "properties": {"seconds": {"type": "number"}}}),
    types.Tool(name="big", description="Answers `size` characters", input_schema={
        "type": "object", "properties": {"size": {"type": "integer"}}}),
    types.Tool(name="context", description="Answers the trace context and credentials it was called with",
               input_schema={"type": "object", "properties": {}}),
]


def tool_server(name: str, bearer: str | None = None, stateful: bool = False) -> Any:
    async def list_tools(ctx: ServerRequestContext[Any, Any],
                         params: types.PaginatedRequestParams | None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=TOOLS)

    async def call_tool(ctx: ServerRequestContext[Any, Any],
                        params: types.CallToolRequestParams) -> types.CallToolResult:
        args = params.arguments or {}
        if params.name == "echo":
            text = f"{name}: {args.get('text', '')}"
        elif params.name == "add":
            text = str(args["a"] + args["b"])
        elif params.name == "sleep":
            await asyncio.sleep(float(args.get("seconds", 1)))
            text = "slept"
        elif params.name == "big":
            text = "x" * int(args.get("size", 0))
        elif params.name == "context":
            request = ctx.request
            text = json.dumps({"meta": dict(ctx.meta or {}),
                               "authorized": request is not None and request.headers.get("authorization")
                               == f"Bearer {bearer}"})
        else:
            return types.CallToolResult(content=[types.TextContent(type="text", text=f"no tool {params.name}")],
                                        is_error=True)
        return types.CallToolResult(content=[types.TextContent(type="text", text=text)])

    server: Server[Any] = Server(name, on_list_tools=list_tools, on_call_tool=call_tool)

    async def health(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    app = server.streamable_http_app(stateless_http=not stateful, json_response=True, host="0.0.0.0",
                                     custom_starlette_routes=[Route("/health", health)])
    if stateful:
        app = handshake_only(app)
    if bearer is None:
        return app

    async def guarded(scope: Any, receive: Any, send: Any) -> None:
        headers = dict(scope.get("headers") or [])
        if scope["type"] == "http" and scope["path"] == "/mcp" and \
                headers.get(b"authorization") != f"Bearer {bearer}".encode():
            await JSONResponse({"error": "unauthorized"}, 401)(scope, receive, send)
            return
        await app(scope, receive, send)

    return guarded


def handshake_only(app: Any) -> Any:
    """Refuses `server/discover`, so that clients fall back to the initialize handshake and its session ids."""

    async def wrapped(scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await app(scope, receive, send)
            return
        body, more = b"", True
        while more:
            message = await receive()
            body, more = body + message.get("body", b""), message.get("more_body", False)
        request = json.loads(body or b"{}")
        if isinstance(request, dict) and request.get("method") == "server/discover":
            error = {"code": types.METHOD_NOT_FOUND, "message": "Method not found"}
            await JSONResponse({"jsonrpc": "2.0", "id": request.get("id"), "error": error})(scope, receive, send)
            return
        replayed = False

        async def replay() -> Any:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await app(scope, replay, send)

    return wrapped


if __name__ == "__main__":
    name, port = sys.argv[1], int(sys.argv[2])
    bearer = sys.argv[3] if len(sys.argv) > 3 else None
    stateful = os.environ.get("TOOL_SERVER_STATEFUL") == "1"
    uvicorn.run(tool_server(name, bearer, stateful), host="127.0.0.1", port=port, log_level="warning")
