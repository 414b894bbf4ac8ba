"""Reading a client's OpenAI request body: size, JSON, and the few fields the gateway acts on."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request

from gateway.errors import ApiError, invalid_request
from gateway.request_extras import OWNED_FIELDS


@dataclass(slots=True)
class OpenAIRequest:
    """The fields the gateway routes and admits by; `body` is forwarded as it came, apart from `model`."""

    body: dict[str, Any]
    model: str
    stream: bool
    wants_usage: bool  # the client asked for the usage chunk at the end of a stream
    priority_class: str | None


async def read_body(request: Request, max_bytes: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > max_bytes:
        raise _too_large(max_bytes)
    data = bytearray()
    async for chunk in request.stream():
        data += chunk
        if len(data) > max_bytes:
            raise _too_large(max_bytes)
    return bytes(data)


def _too_large(max_bytes: int) -> ApiError:
    return ApiError(413, f"request body exceeds {max_bytes} bytes", "invalid_request_error", "body_too_large")


def parse(raw: bytes, *, chat: bool, classes: set[str]) -> OpenAIRequest:
    """Validates what the gateway itself relies on; the upstream validates the rest."""
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):  # RecursionError: nesting deeper than the parser's stack
        raise invalid_request("the body is not valid JSON") from None
    if not isinstance(body, dict):
        raise invalid_request("the body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid_request("'model' is required and must be a string", "model")
    required = "messages" if chat else "prompt"
    value = body.get(required)
    if chat and (not isinstance(value, list) or not value):
        raise invalid_request("'messages' must be a non-empty array", "messages")
    if not chat and not isinstance(value, str | list):
        raise invalid_request("'prompt' must be a string or an array", "prompt")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid_request("'stream' must be a boolean", "stream")
    for name in ("max_tokens", "max_completion_tokens"):
        limit = body.get(name)
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise invalid_request(f"'{name}' must be a positive integer", name)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise invalid_request("'stream_options' must be an object", "stream_options")
    priority = body.get("priority")
    priority_class = None
    if isinstance(priority, str):
        if priority not in classes:
            raise invalid_request(f"'priority' must be one of {sorted(classes)}", "priority")
        priority_class = priority
    # the gateway sets the upstream's priority and cache_salt itself (request_extras.py); a client's never pass
    body = {k: v for k, v in body.items() if k not in OWNED_FIELDS}
    wants_usage = bool(stream and options and options.get("include_usage"))
    return OpenAIRequest(body, model, stream, wants_usage, priority_class)
