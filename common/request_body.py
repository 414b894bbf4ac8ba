"""Reading a client's request body: bounded in size and time, and decoded as JSON of bounded depth.

Plain Starlette, so both tiers read bodies alike: the refusals are OpenAI errors (413, 408, 400) instead of a
hang on a slow client or a RecursionError on a deeply nested one.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.types import Message, Receive

from common import fast_json
from common.openai_errors import ApiError

CONTAINERS = (list, dict)


async def read_body(request: Request, *, max_bytes: int, timeout: float,
                    too_large_code: str = "body_too_large") -> bytes:
    """The whole body, refused as soon as it is known to exceed `max_bytes` or to take longer than `timeout`.

    `too_large_code` is the 413's `code`, for a tier whose clients already know it by another name.
    """
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise invalid_body("the Content-Length header is not a number")
        if int(declared) > max_bytes:
            raise _too_large(max_bytes, too_large_code)
    data = bytearray()
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                data += chunk
                if len(data) > max_bytes:
                    raise _too_large(max_bytes, too_large_code)
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout:g}s", "invalid_request_error",
                       "request_timeout", None, {"connection": "close"}) from None
    except ClientDisconnect:
        # 499 as nginx logs it: nobody reads this answer, but metrics and logs tell it from a bad request
        raise ApiError(499, "the client closed the connection before the body ended", "invalid_request_error",
                       "client_disconnected") from None
    return bytes(data)


def replay_body(body: bytes, receive: Receive) -> Receive:
    """An ASGI receive that yields `body` whole once, then the connection's own messages (so that a disconnect
    is still seen): for handing a body already read to another app, or a new body to the same path."""
    sent = False

    async def replayed() -> Message:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replayed


def with_body(request: Request, body: bytes) -> Request:
    """The request with another body (its Content-Length to match): a body read already, or a new one, served
    through a path that reads it again; the connection's messages follow, so a disconnect is still seen."""
    headers = [(k, v) for k, v in request.scope["headers"] if k.lower() != b"content-length"]
    scope = {**request.scope, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
    return Request(scope, replay_body(body, request.receive))


def decode_json(raw: bytes, *, max_depth: int, allow_nan: bool = True, invalid_code: str | None = None) -> Any:
    """The JSON value of `raw`; a 400 when it is not JSON or nests arrays and objects deeper than `max_depth`.

    `allow_nan=False` also refuses NaN and Infinity, which Python reads but JSON does not have; `invalid_code` is
    the `code` of the 400 for a body that is not JSON.
    """
    try:
        value = fast_json.loads(raw) if allow_nan else json.loads(raw, parse_constant=_refuse_constant)
    except RecursionError:  # deeper than the C parser's own stack allows
        raise _too_deep(max_depth) from None
    except ValueError as exc:
        raise invalid_body(f"the body is not valid JSON: {exc}", invalid_code) from None
    # only a body with more brackets than the limit can nest past it: the walk is skipped for the common case
    if raw.count(b"[") + raw.count(b"{") > max_depth and _depth_exceeds(value, max_depth):
        raise _too_deep(max_depth)
    return value


def _depth_exceeds(value: Any, max_depth: int) -> bool:
    """Whether containers nest deeper than `max_depth`, walked without recursion."""
    level = [value] if isinstance(value, CONTAINERS) else []
    depth = 0
    while level:
        depth += 1
        if depth > max_depth:
            return True
        children: list[Any] = []
        for container in level:
            items = container.values() if isinstance(container, dict) else container
            children.extend(item for item in items if isinstance(item, CONTAINERS))
        level = children
    return False


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def invalid_body(message: str, code: str | None = None) -> ApiError:
    return ApiError(400, message, "invalid_request_error", code)


def _too_deep(max_depth: int) -> ApiError:
    return ApiError(400, f"the body nests arrays and objects deeper than {max_depth} levels",
                    "invalid_request_error", "json_too_deep")


def _too_large(max_bytes: int, code: str) -> ApiError:
    return ApiError(413, f"request body exceeds {max_bytes} bytes", "invalid_request_error", code)
