"""A client's OpenAI request body: its JSON, and the few fields the gateway acts on."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from common.request_body import decode_json
from gateway.errors import invalid_request
from gateway.path.request_extras import OWNED_FIELDS

MAX_MODEL_CHARS = 256  # a model name longer than this is no model anyone serves


class Endpoint(StrEnum):
    """The upstream path a request goes to."""

    chat = "/chat/completions"
    completions = "/completions"
    embeddings = "/embeddings"

    @property
    def generates(self) -> bool:
        """Whether it produces tokens (and may stream them); an embedding costs its input tokens alone."""
        return self is not Endpoint.embeddings


@dataclass(slots=True)
class OpenAIRequest:
    """The fields the gateway routes and admits by; `body` is forwarded as it came, apart from `model`."""

    body: dict[str, Any]
    model: str
    stream: bool
    wants_usage: bool  # the client asked for the usage chunk at the end of a stream
    priority_class: str | None
    endpoint: Endpoint = Endpoint.chat


def parse(raw: bytes, *, endpoint: Endpoint, classes: set[str], max_depth: int) -> OpenAIRequest:
    """Validates what the gateway itself relies on; the upstream validates the rest."""
    return read(decode_json(raw, max_depth=max_depth), endpoint=endpoint, classes=classes)


def request_model(body: Any) -> str:
    """The body's `model`, once the body is known to be a JSON object."""
    if not isinstance(body, dict):
        raise invalid_request("the body must be a JSON object")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid_request("'model' is required and must be a string", "model")
    if len(model) > MAX_MODEL_CHARS:
        raise invalid_request(f"'model' is longer than {MAX_MODEL_CHARS} characters", "model")
    return model


def read(body: Any, *, endpoint: Endpoint, classes: set[str]) -> OpenAIRequest:
    """`parse` for a body already decoded (or translated from another API)."""
    model = request_model(body)
    required = {Endpoint.chat: "messages", Endpoint.completions: "prompt", Endpoint.embeddings: "input"}[endpoint]
    value = body.get(required)
    if endpoint is Endpoint.chat and (not isinstance(value, list) or not value):
        raise invalid_request("'messages' must be a non-empty array", "messages")
    if endpoint is not Endpoint.chat and not isinstance(value, str | list):
        raise invalid_request(f"'{required}' must be a string or an array", required)
    stream = body.get("stream", False)
    if not isinstance(stream, bool) or (stream and not endpoint.generates):
        raise invalid_request("'stream' must be a boolean, and false for embeddings", "stream")
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
    return OpenAIRequest(body, model, stream, wants_usage, priority_class, endpoint)
