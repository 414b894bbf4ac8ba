"""Reading a client's request body: bounded in size and time, and decoded as JSON of bounded depth.

Plain Starlette, so both tiers read bodies alike: the refusals are OpenAI errors (413, 408, 400) instead of a
hang on a slow client or a RecursionError on a deeply nested one.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from starlette.requests import ClientDisconnect, Request

from tidegate.openai_errors import ApiError

CONTAINERS = (list, dict)


async def read_body(request: Request, *, max_bytes: int, timeout: float) -> bytes:
    """The whole body, refused as soon as it is known to exceed `max_bytes` or to take longer than `timeout`."""
    declared = request.headers.get("content-length")
    if declared is not None:
        if not declared.isdigit():
            raise invalid_body("the Content-Length header is not a number")
        if int(declared) > max_bytes:
            raise _too_large(max_bytes)
    data = bytearray()
    try:
        async with asyncio.timeout(timeout):
            async for chunk in request.stream():
                data += chunk
                if len(data) > max_bytes:
                    raise _too_large(max_bytes)
    except TimeoutError:
        raise ApiError(408, f"the request body did not arrive within {timeout:g}s", "invalid_request_error",
                       "request_timeout", None, {"connection": "close"}) from None
    except ClientDisconnect:
        # 499 as nginx logs it: nobody reads this answer, but metrics and logs tell it from a bad request
        raise ApiError(499, "the client closed the connection before the body ended", "invalid_request_error",
                       "client_disconnected") from None
    return bytes(data)


def decode_json(raw: bytes, *, max_depth: int) -> Any:
    """The JSON value of `raw`; a 400 when it is not JSON or nests arrays and objects deeper than `max_depth`."""
    try:
        value = json.loads(raw)
    except RecursionError:  # deeper than the C parser's own stack allows
        raise _too_deep(max_depth) from None
    except ValueError:
        raise invalid_body("the body is not valid JSON") from None
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


def invalid_body(message: str) -> ApiError:
    return ApiError(400, message, "invalid_request_error", None)


def _too_deep(max_depth: int) -> ApiError:
    return ApiError(400, f"the body nests arrays and objects deeper than {max_depth} levels",
                    "invalid_request_error", "json_too_deep")


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"request body exceeds {max_bytes} bytes", "invalid_request_error", "body_too_large")
