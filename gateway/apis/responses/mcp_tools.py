"""The Responses API's `mcp` tools as this gateway runs them: pure functions, no I/O.

An `mcp` tool names a registered MCP server by its `server_label` (the gateway's credentials and allowlists
apply; a request cannot bring its own `server_url` or headers). Its tools reach the model as function tools named
`server__tool`; each call the model makes is run by the gateway and shown in the output as an `mcp_call` item,
after the `mcp_list_tools` item of its server.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mcp_types as types

from gateway.apis.mcp_entry import registered_server
from gateway.apis.responses.answer import new_id
from gateway.errors import invalid_request

DEFAULT_MAX_TOOL_CALLS = 8
MOST_TOOL_CALLS = 32  # a bound on the rounds one request may take, whatever it asks
SUPPORTED = frozenset({"type", "server_label", "server_url", "allowed_tools", "require_approval",
                       "server_description"})


@dataclass(slots=True)
class McpToolSpec:
    """One `mcp` tool of a request: the registered server and the tools it narrows to (None: every tool)."""

    server: str
    allowed: frozenset[str] | None


def has_mcp_tools(body: Any) -> bool:
    tools = body.get("tools") if isinstance(body, dict) else None
    return isinstance(tools, list) and any(isinstance(t, dict) and t.get("type") == "mcp" for t in tools)


def mcp_specs(tools: list[Any], registered: dict[str, str]) -> list[McpToolSpec]:
    """The request's `mcp` tools, checked against the registered servers (name -> URL); 400 for what cannot run."""
    specs = []
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict) or tool.get("type") != "mcp":
            continue
        where = f"tools[{i}]"
        label = registered_server(tool, where, registered, SUPPORTED, "server_label", "server_url")
        if tool.get("require_approval", "never") != "never":
            raise invalid_request(f"'{where}.require_approval': only \"never\" is supported (the key's allowlist "
                                  "is the approval)", f"{where}.require_approval")
        specs.append(McpToolSpec(label, _allowed(tool.get("allowed_tools"), where)))
    return specs


def _allowed(value: Any, where: str) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, dict):  # {"tool_names": [...]}
        value = value.get("tool_names")
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise invalid_request(f"'{where}.allowed_tools' must be an array of tool names", f"{where}.allowed_tools")
    return frozenset(value)


def max_tool_calls(body: dict[str, Any]) -> int:
    value = body.get("max_tool_calls")
    if value is None:
        return DEFAULT_MAX_TOOL_CALLS
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MOST_TOOL_CALLS:
        raise invalid_request(f"'max_tool_calls' must be an integer from 1 to {MOST_TOOL_CALLS}", "max_tool_calls")
    return value


def function_tool(name: str, tool: types.Tool) -> dict[str, Any]:
    """An MCP tool as the Responses API's function tool, under its public name."""
    return {"type": "function", "name": name, "description": tool.description or "",
            "parameters": tool.input_schema or {"type": "object", "properties": {}}}


def list_tools_item(server: str, tools: list[types.Tool]) -> dict[str, Any]:
    return {"id": new_id("mcpl"), "type": "mcp_list_tools", "server_label": server, "error": None,
            "tools": [{"name": t.name, "description": t.description, "input_schema": t.input_schema,
                       "annotations": None if t.annotations is None else t.annotations.model_dump(exclude_none=True)}
                      for t in tools]}


def call_item(server: str, tool: str, arguments: str, output: str | None, error: str | None) -> dict[str, Any]:
    return {"id": new_id("mcp"), "type": "mcp_call", "server_label": server, "name": tool, "arguments": arguments,
            "output": output, "error": error, "approval_request_id": None}
