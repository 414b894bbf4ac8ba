"""Admin routes for MCP servers at run time; a server's api_key is write-only, as a channel's."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from config.mcp import McpServer
from gateway.admin.channels import Handler, ReadJson
from gateway.admin.keyed_records import key_hidden, named, refuse_rename, updated_record, validated_record
from gateway.errors import ApiError
from gateway.mcp.names import public_name
from gateway.mcp.registry import McpRegistry, server_record
from gateway.mcp.upstream import McpUpstream


def mcp_server_handlers(registry: McpRegistry, read_json: ReadJson) -> dict[str, Handler]:
    """The handlers by their action in the admin route table (gateway.admin.access.RULES)."""
    api = McpServerAdmin(registry, read_json)
    return {"mcp-servers.list": api.list_servers, "mcp-servers.create": api.add_server,
            "mcp-servers.read": api.get_server, "mcp-servers.update": api.update_server,
            "mcp-servers.remove": api.remove_server}


async def server_view(upstream: McpUpstream, with_tools: bool = False) -> dict[str, Any]:
    """Settings, breaker and calls in flight; whether an api_key is set, never the key."""
    view = {**key_hidden(upstream.config, "api_key_file"), "breaker": upstream.breaker.state.value,
            "in_flight": upstream.in_flight}
    if with_tools:
        view["tools"] = [{"name": public_name(upstream.name, t.name), "description": t.description}
                         for t in await upstream.tools()]
    return view


class McpServerAdmin:
    def __init__(self, registry: McpRegistry, read_json: ReadJson) -> None:
        self._registry = registry
        self._read_json = read_json

    def _server(self, request: Request) -> McpUpstream:
        return named(self._registry.servers, request, "MCP server", "mcp_server_not_found")

    async def list_servers(self, request: Request) -> Any:
        return {"data": [await server_view(u) for u in self._registry.servers.values()]}

    async def get_server(self, request: Request) -> Any:
        return await server_view(self._server(request), with_tools=True)

    async def add_server(self, request: Request) -> Any:
        config = validated_record(McpServer, await self._read_json(request))
        if config.name in self._registry.servers:
            raise ApiError(409, f"MCP server {config.name!r} exists; PATCH it instead", "invalid_request_error",
                           "mcp_server_exists", "name")
        return 201, await server_view(await self._registry.put(config))

    async def update_server(self, request: Request) -> Any:
        upstream = self._server(request)
        changes = await self._read_json(request)
        refuse_rename(changes, upstream.name, "an MCP server")
        config = updated_record(McpServer, server_record(upstream.config), changes, "url")
        return await server_view(await self._registry.put(config))

    async def remove_server(self, request: Request) -> Any:
        upstream = self._server(request)
        await self._registry.delete(upstream.name)
        return {"name": upstream.name, "deleted": True}
