"""`POST /v1/messages` with Anthropic's MCP connector: `mcp_servers` entries naming registered MCP servers. Their
tools reach the model as tools named `server__tool`; each `tool_use` the model makes runs through the gateway's MCP
call path and goes back as its `tool_result`, round after round, until the model stops asking (at most
MAX_TOOL_CALLS calls); the answer shows each call as `mcp_tool_use` and `mcp_tool_result` blocks before the model's
last content, with the rounds' usage summed; a streamed request gets the whole message's events once the rounds are
done."""

from __future__ import annotations

import json
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from common.event_stream import named_event
from common.request_body import with_body
from gateway.anthropic_wire import messages_error
from gateway.apis.mcp_entry import registered_server, served_or_read
from gateway.apis.messages import MESSAGES
from gateway.errors import ApiError, invalid_request
from gateway.mcp.calls import McpCalls
from gateway.mcp.model_calls import run_model_call
from gateway.mcp.names import public_name
from gateway.path.proxy import Proxy
from quota import KeyInfo, QuotaService

MAX_TOOL_CALLS = 8
SERVER_FIELDS = frozenset({"type", "url", "name", "tool_configuration"})
USAGE = ("input_tokens", "output_tokens")


class MessagesApi:
    def __init__(self, proxy: Proxy, quota: QuotaService, calls: McpCalls) -> None:
        self._proxy = proxy
        self._quota = quota
        self._calls = calls

    async def create(self, request: Request) -> Response:
        try:
            read = await served_or_read(self._proxy, self._quota, request, MESSAGES,
                                        lambda body: body.get("mcp_servers") is not None)
            if isinstance(read, Response):
                return read
            return await self._connected(request, *read)
        except ApiError as error:
            return JSONResponse(messages_error(error), error.status, error.headers)

    async def _connected(self, request: Request, key: KeyInfo, body: dict[str, Any]) -> Response:
        exposed, tools = await self._tools(key, body["mcp_servers"])
        base = {name: value for name, value in body.items() if name not in ("mcp_servers", "tool_choice")}
        own = body.get("tools") or []
        if not isinstance(own, list):
            raise invalid_request("'tools' must be an array", "tools")
        if own or tools:
            base["tools"] = [*own, *tools]
        choice, messages = body.get("tool_choice"), list(body.get("messages") or [])
        shown: list[dict[str, Any]] = []
        usage = dict.fromkeys(USAGE, 0)
        made = 0
        while True:
            spent = made >= MAX_TOOL_CALLS
            asked = {"type": "none"} if spent and tools else (
                choice if made == 0 or not isinstance(choice, dict) or choice.get("type") in ("auto", "none")
                else {"type": "auto"})  # a forced choice forces the first round only
            round_body = {**base, "messages": messages, "stream": False, **({"tool_choice": asked} if asked else {})}
            answer = await self._proxy.serve(with_body(request, json.dumps(round_body).encode()), MESSAGES)
            if answer.status_code != 200:
                return answer
            message = json.loads(bytes(answer.body))
            for name in USAGE:
                usage[name] += int((message.get("usage") or {}).get(name) or 0)
            uses = [b for b in message["content"] if b.get("type") == "tool_use"]
            if spent or message.get("stop_reason") != "tool_use" or not uses or any(b["name"] not in exposed
                                                                                  for b in uses):
                break  # answered, out of calls or tokens, or a tool of the client's own: the client's turn
            run = uses[:MAX_TOOL_CALLS - made]
            results = []
            for use in run:
                server, tool = exposed[use["name"]]
                outcome = await run_model_call(self._calls, key, use["name"], use.get("input") or {},
                                               request.headers.get("x-request-id") or use["id"], request.headers)
                failed = outcome.error is not None
                shown += [{"type": "mcp_tool_use", "id": use["id"], "name": tool, "server_name": server,
                           "input": use.get("input") or {}},
                          {"type": "mcp_tool_result", "tool_use_id": use["id"], "is_error": failed,
                           "content": [{"type": "text", "text": outcome.text}]}]
                results.append({"type": "tool_result", "tool_use_id": use["id"], "content": outcome.text,
                                "is_error": failed})
            made += len(run)
            said = [b for b in message["content"] if b.get("type") != "tool_use" or b in run]
            messages += [{"role": "assistant", "content": said}, {"role": "user", "content": results}]
        message.update(content=[*shown, *message["content"]], usage={**(message.get("usage") or {}), **usage})
        headers = {name: value for name, value in answer.headers.items() if name.startswith("x-")}
        if body.get("stream"):  # the rounds are done: the stream carries the whole message at once
            events = b"".join(named_event(e["type"], e) for e in message_events(message))
            return Response(events, headers={**headers, "cache-control": "no-cache"}, media_type="text/event-stream")
        return JSONResponse(message, headers=headers)

    async def _tools(self, key: KeyInfo, servers: Any) -> tuple[dict[str, tuple[str, str]], list[dict[str, Any]]]:
        """(public name -> (server, tool), the tools as Messages tools) of the request's `mcp_servers`."""
        if not isinstance(servers, list) or not servers:
            raise invalid_request("'mcp_servers' must be a non-empty array", "mcp_servers")
        registered = {name: u.config.url for name, u in self._calls.registry.servers.items()}
        listed = await self._calls.tools_for(key)
        exposed: dict[str, tuple[str, str]] = {}
        tools: list[dict[str, Any]] = []
        for i, server in enumerate(servers):
            name, allowed = _server(server, f"mcp_servers[{i}]", registered)
            for upstream, tool in listed:
                if upstream.name == name and (allowed is None or tool.name in allowed):
                    public = public_name(name, tool.name)
                    exposed[public] = (name, tool.name)
                    tools.append({"name": public, "description": tool.description or "",
                                  "input_schema": tool.input_schema or {"type": "object", "properties": {}}})
        return exposed, tools


def message_events(message: dict[str, Any]) -> list[dict[str, Any]]:
    """A finished message as Anthropic's stream events: each block started whole (a text block's text in one
    delta), then the stop reason and usage."""
    usage = message.get("usage") or {}
    events: list[dict[str, Any]] = [{"type": "message_start", "message": {
        **message, "content": [], "stop_reason": None, "stop_sequence": None,
        "usage": {**usage, "output_tokens": 0}}}]
    for index, block in enumerate(message["content"]):
        text = block.get("type") == "text"
        events.append({"type": "content_block_start", "index": index,
                       "content_block": {**block, "text": ""} if text else block})
        if text:
            events.append({"type": "content_block_delta", "index": index,
                           "delta": {"type": "text_delta", "text": block.get("text", "")}})
        events.append({"type": "content_block_stop", "index": index})
    events += [{"type": "message_delta", "delta": {"stop_reason": message.get("stop_reason"),
                                                   "stop_sequence": message.get("stop_sequence")},
                "usage": {"output_tokens": usage.get("output_tokens", 0)}},
               {"type": "message_stop"}]
    return events


def _server(server: Any, where: str, registered: dict[str, str]) -> tuple[str, frozenset[str] | None]:
    """(the registered server's name, its allowed tools or None) of one `mcp_servers` entry; 400 for what cannot
    run: another URL than the registered one, an authorization_token (the gateway holds the credentials)."""
    if not isinstance(server, dict):
        raise invalid_request(f"'{where}' must be an object", where)
    if server.get("type", "url") != "url":
        raise invalid_request(f"'{where}.type' must be url", f"{where}.type")
    name = registered_server(server, where, registered, SERVER_FIELDS, "name", "url")
    config = server.get("tool_configuration") or {}
    if not isinstance(config, dict):
        raise invalid_request(f"'{where}.tool_configuration' must be an object", f"{where}.tool_configuration")
    if config.get("enabled") is False:
        return name, frozenset()
    allowed = config.get("allowed_tools")
    if allowed is not None and not (isinstance(allowed, list) and all(isinstance(t, str) for t in allowed)):
        raise invalid_request(f"'{where}.tool_configuration.allowed_tools' must be an array of tool names",
                              f"{where}.tool_configuration.allowed_tools")
    return name, None if allowed is None else frozenset(allowed)
