"""A Responses request with `mcp` tools: rounds of the model (each one request through the proxy's path, admitted
and charged as any) and of the tool calls it makes (each through the gateway's MCP call path), until the model
answers without calling an MCP tool or `max_tool_calls` is spent; then one response shows them all."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from common.event_stream import named_event
from common.request_body import with_body
from gateway.apis.responses.mcp_events import response_events
from gateway.apis.responses.mcp_tools import (
    call_item,
    function_tool,
    list_tools_item,
    max_tool_calls,
    mcp_specs,
)
from gateway.apis.responses.request import input_items
from gateway.apis.responses.store import ResponseStore, StoredResponse
from gateway.mcp.calls import McpCalls
from gateway.mcp.model_calls import parsed_arguments, run_model_call
from gateway.mcp.names import public_name
from gateway.path.client_wire import ClientWire
from gateway.path.proxy import Proxy
from quota import KeyInfo

# request fields the loop itself spends, never sent to a round
LOOP_FIELDS = ("tools", "max_tool_calls", "previous_response_id", "input", "store", "tool_choice")
USAGE = ("input_tokens", "output_tokens", "total_tokens")


class McpTurns:
    def __init__(self, proxy: Proxy, store: ResponseStore, calls: McpCalls) -> None:
        self._proxy = proxy
        self._store = store
        self._calls = calls

    async def answer(self, request: Request, body: dict[str, Any], key: KeyInfo, history: list[dict[str, Any]],
                     turn: Callable[[ResponseStore], ClientWire]) -> Response:
        """`turn(store)` makes the wire of one round (the Responses API's own); `history` is the conversation
        that `previous_response_id` continues."""
        registered = {name: u.config.url for name, u in self._calls.registry.servers.items()}
        specs, limit = mcp_specs(body["tools"], registered), max_tool_calls(body)
        listed = await self._calls.tools_for(key)
        exposed: dict[str, tuple[str, str]] = {}  # public name -> (server, tool)
        listings, functions = [], []
        for spec in specs:
            tools = [t for u, t in listed if u.name == spec.server and (spec.allowed is None or t.name in spec.allowed)]
            listings.append(list_tools_item(spec.server, tools))
            for tool in tools:
                exposed[public_name(spec.server, tool.name)] = (spec.server, tool.name)
                functions.append(function_tool(public_name(spec.server, tool.name), tool))
        own = [t for t in body["tools"] if not (isinstance(t, dict) and t.get("type") == "mcp")]
        base = {name: value for name, value in body.items() if name not in LOOP_FIELDS}
        if own or functions:
            base["tools"] = [*own, *functions]
        choice = body.get("tool_choice")
        items = [*history, *input_items(body.get("input"))]
        made: list[dict[str, Any]] = []
        usage = dict.fromkeys(USAGE, 0)
        while True:
            spent = len(made) >= limit
            # a forced choice forces the first round only: after a call the model may answer
            asked = "none" if spent and functions else (choice if not made or choice in (None, "auto", "none")
                                                         else "auto")
            round_body = {**base, "input": items, "store": False, "stream": False,
                          **({"tool_choice": asked} if asked else {})}
            answer = await self._proxy.serve(with_body(request, json.dumps(round_body).encode()), turn(self._store))
            if answer.status_code != 200:
                return answer
            response = json.loads(bytes(answer.body))
            for name in USAGE:
                usage[name] += int((response.get("usage") or {}).get(name) or 0)
            wanted = [i for i in response["output"] if i.get("type") == "function_call"]
            if spent or not wanted or response["status"] != "completed" or any(i["name"] not in exposed
                                                                              for i in wanted):
                break  # answered, out of calls or tokens, or a function of the client's own: the client's turn
            for item in wanted[:limit - len(made)]:
                server, tool_name = exposed[item["name"]]
                outcome = await run_model_call(self._calls, key, item["name"], item["arguments"],
                                               request.headers.get("x-request-id") or item["call_id"],
                                               request.headers)
                made.append(call_item(server, tool_name, item["arguments"], outcome.output, outcome.error))
                sent = item["arguments"] if parsed_arguments(item["arguments"]) is not None else "{}"
                items += [{"type": "function_call", "call_id": item["call_id"], "name": item["name"],
                           "arguments": sent},  # what the next round reads back must be JSON
                          {"type": "function_call_output", "call_id": item["call_id"], "output": outcome.text}]
        last = response["output"]
        response.update(output=[*listings, *made, *last], usage={**(response.get("usage") or {}), **usage},
                        tools=body["tools"], tool_choice=choice or "auto", store=body.get("store", True),
                        previous_response_id=body.get("previous_response_id"), max_tool_calls=limit)
        if response["store"] and not await self._kept(response, key, [*items, *last]):
            response["store"] = False
        headers = {name: value for name, value in answer.headers.items() if name.startswith("x-")}
        if body.get("stream"):  # the rounds are done: the stream carries the whole response at once
            events = b"".join(named_event(e["type"], e) for e in response_events(response))
            return Response(events, headers={**headers, "cache-control": "no-cache"}, media_type="text/event-stream")
        return JSONResponse(response, headers=headers)

    async def _kept(self, response: dict[str, Any], key: KeyInfo, items: list[dict[str, Any]]) -> bool:
        """Stores the response to continue from; its conversation keeps the calls as function calls and their
        outputs, which any later round can read."""
        if response["status"] not in ("completed", "incomplete"):
            return False
        try:
            return await self._store.put(response["id"], StoredResponse(key.account_id, response, items))
        except Exception:  # the answer stands; only continuing from it will fail
            return False
