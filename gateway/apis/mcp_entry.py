"""The way into an API that may run MCP tools on the gateway (Responses `mcp` tools, Messages `mcp_servers`): a
request that asks for none goes the one path untouched; one that does is handed over with its key and body."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from common.request_body import decode_json, read_body, with_body
from gateway.auth import authenticate
from gateway.errors import ApiError, invalid_request
from gateway.path.client_wire import ClientWire
from gateway.path.proxy import Proxy
from quota import KeyInfo, QuotaService


async def served_or_read(proxy: Proxy, quota: QuotaService, request: Request, wire: ClientWire,
                         wants_tools: Callable[[Any], bool]) -> Response | tuple[KeyInfo, dict[str, Any]]:
    """The path's answer to a request that does not ask for MCP tools, else (its key, its JSON body); an
    ApiError for a body that cannot be read."""
    try:
        key = await authenticate(quota, request)
    except ApiError:  # the path answers it, and counts it as it counts every refusal
        return await proxy.serve(request, wire)
    settings = proxy.settings
    raw = await read_body(request, max_bytes=settings.max_body_bytes, timeout=settings.server.body_timeout)
    try:
        body = decode_json(raw, max_depth=settings.server.max_json_depth)
    except ApiError:
        body = None
    if not isinstance(body, dict) or not wants_tools(body):  # plain (or broken, which the path refuses as usual)
        return await proxy.serve(with_body(request, raw), wire)
    return key, body


def registered_server(entry: dict[str, Any], where: str, registered: dict[str, str], fields: frozenset[str],
                      name_field: str, url_field: str) -> str:
    """The registered server (name -> URL) a request's MCP entry names; 400 for a field the gateway does not take
    (credentials: it holds each server's own), an unknown name, or a URL other than the registered one."""
    unknown = sorted(set(entry) - fields)
    if unknown:
        raise invalid_request(f"'{where}.{unknown[0]}' is not supported: the gateway holds each MCP server's "
                              "credentials", f"{where}.{unknown[0]}")
    name = entry.get(name_field)
    if not isinstance(name, str) or name not in registered:
        raise invalid_request(f"'{where}.{name_field}' must name an MCP server registered with this gateway "
                              f"({', '.join(sorted(registered)) or 'none is'})", f"{where}.{name_field}")
    if entry.get(url_field, registered[name]) != registered[name]:
        raise invalid_request(f"'{where}.{url_field}' differs from the registered server's; leave it out",
                              f"{where}.{url_field}")
    return name
