"""The OpenAI routes: a client's request body (its JSON, and the few fields the gateway acts on), the wire that
passes chat, completions and embeddings through as they are, and the model list."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from common.request_body import decode_json
from common.request_id import request_id as request_id_of
from gateway.auth import authenticate
from gateway.channels.router import Router
from gateway.errors import ApiError, invalid_request
from gateway.path.client_wire import BeforeEnd
from gateway.path.relay import StreamRelay
from gateway.path.request_extras import OWNED_FIELDS
from gateway.records import Endpoint, OpenAIRequest
from quota import KeyInfo, QuotaService

MAX_MODEL_CHARS = 256  # a model name longer than this is no model anyone serves


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


class OpenAIWire:
    """`/v1/chat/completions`, `/v1/completions` and `/v1/embeddings`: the upstream's shapes are the client's."""

    def __init__(self, endpoint: Endpoint):
        self.endpoint = endpoint

    async def parse(self, raw: bytes, key: KeyInfo, *, classes: set[str], max_depth: int) -> OpenAIRequest:
        return parse(raw, endpoint=self.endpoint, classes=classes, max_depth=max_depth)

    def error_body(self, error: ApiError) -> dict[str, Any]:
        return error.body()

    async def whole(self, status: int, body: bytes) -> tuple[int, bytes]:
        return status, body

    async def answer(self, whole: dict[str, Any]) -> dict[str, Any]:
        return whole

    def events(self, relay: StreamRelay, before_end: BeforeEnd, model: str,
               prompt_tokens: int) -> AsyncIterator[bytes]:
        return relay.stream(before_end)


CHAT = OpenAIWire(Endpoint.chat)
COMPLETIONS = OpenAIWire(Endpoint.completions)
EMBEDDINGS = OpenAIWire(Endpoint.embeddings)


def models_endpoint(quota: QuotaService, router: Router) -> Callable[[Request], Awaitable[Response]]:
    """`GET /v1/models`: the models the caller's key may use."""

    async def models(request: Request) -> Response:
        request_id = request_id_of(request.headers)
        try:
            key = await authenticate(quota, request)
        except ApiError as error:
            return error.response(request_id)
        data: list[dict[str, Any]] = [
            {"id": model, "object": "model", "created": 0, "owned_by": "tidegate"}
            for model in router.models() if key.allows(model)
        ]
        return JSONResponse({"object": "list", "data": data}, headers={"x-request-id": request_id})

    return models
