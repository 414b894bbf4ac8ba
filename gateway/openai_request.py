"""A client's OpenAI request body: its JSON, and the few fields the gateway acts on."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from gateway.errors import invalid_request
from gateway.request_extras import OWNED_FIELDS
from tidegate.request_body import decode_json

MAX_MODEL_CHARS = 256  # a model name longer than this is no model anyone serves


@dataclass(slots=True)
class OpenAIRequest:
    """The fields the gateway routes and admits by; `body` is forwarded as it came, apart from `model`."""

    body: dict[str, Any]
    model: str
    stream: bool
    wants_usage: bool  # the client asked for the usage chunk at the end of a stream
    priority_class: str | None


def parse(raw: bytes, *, chat: bool, classes: set[str], max_depth: int) -> OpenAIRequest:
    """Validates what the gateway itself relies on; the upstream validates the rest."""
    return read(decode_json(raw, max_depth=max_depth), chat=chat, classes=classes)


def read(body: Any, *, chat: bool, classes: set[str]) -> OpenAIRequest:
    """`parse` for a body already decoded (or translated from another API)."""
    if not isinstance(body, dict):
        raise invalid_request("the body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid_request("'model' is required and must be a string", "model")
    if len(model) > MAX_MODEL_CHARS:
        raise invalid_request(f"'model' is longer than {MAX_MODEL_CHARS} characters", "model")
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
