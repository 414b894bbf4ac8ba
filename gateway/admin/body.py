"""Reading an admin request's JSON body, bounded, and refusing fields a route does not know."""

from __future__ import annotations

from typing import Any

from starlette.requests import Request

from common.request_body import decode_json, read_body
from gateway.errors import invalid_request

# admin writes are small records: a quota nests three levels
ADMIN_BODY_BYTES, ADMIN_BODY_TIMEOUT, ADMIN_JSON_DEPTH = 256 * 1024, 30.0, 16


async def json_body(request: Request) -> dict[str, Any]:
    raw = await read_body(request, max_bytes=ADMIN_BODY_BYTES, timeout=ADMIN_BODY_TIMEOUT)
    request._body = raw  # Starlette replays it to the next reader: the access check reads before the handler
    body = decode_json(raw or b"{}", max_depth=ADMIN_JSON_DEPTH)
    if not isinstance(body, dict):
        raise invalid_request("the body must be a JSON object")
    return body


def reject_unknown(body: dict[str, Any], allowed: set[str]) -> None:
    unknown = sorted(set(body) - allowed)
    if unknown:
        raise invalid_request(f"unknown fields: {', '.join(unknown)}; allowed: {', '.join(sorted(allowed))}")
