"""The one interface of an inbound API: how it reads its requests and writes its answers around the one path.

The OpenAI routes (chat, completions, embeddings) pass everything through as it is; Anthropic's Messages and
OpenAI's Responses translate at this edge, so auth, admission, priority, routing, retries, relay and settlement
stay one path (`Proxy.serve`) for all of them. `gateway/app.py` routes each inbound path to its wire, so the path
imports none of them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from gateway.errors import ApiError
from gateway.path.relay import StreamRelay
from gateway.records import OpenAIRequest
from quota import KeyInfo

BeforeEnd = Callable[[], Awaitable[None]]


class ClientWire(Protocol):
    """One inbound API, as a shared object or one per request (a wire that keeps what it read).

    `parse` turns the raw body, once the caller's key is known, into the OpenAI request served (its `endpoint`
    says which upstream API serves it). The rest put every kind of answer back in the client's shape: an error
    (`error_body`), a whole upstream body of any status (`whole`), an assembled chat or completion object
    (`answer`, which raises an `ApiError` for an answer it cannot carry), and a relayed stream (`events`, which
    awaits `before_end` once the chunks run out and before its last event; `relay.outcome` then says whether the
    upstream's stream failed).

        class Echo:
            async def parse(self, raw, key, *, classes, max_depth):
                return openai.parse(raw, endpoint=Endpoint.chat, classes=classes, max_depth=max_depth)
            def error_body(self, error):
                return error.body()
            async def whole(self, status, body):
                return status, body
            async def answer(self, whole):
                return whole
            def events(self, relay, before_end, model, prompt_tokens):
                return relay.stream(before_end)
    """

    async def parse(self, raw: bytes, key: KeyInfo, *, classes: set[str], max_depth: int) -> OpenAIRequest: ...

    def error_body(self, error: ApiError) -> dict[str, Any]: ...

    async def whole(self, status: int, body: bytes) -> tuple[int, bytes]: ...

    async def answer(self, whole: dict[str, Any]) -> dict[str, Any]: ...

    def events(self, relay: StreamRelay, before_end: BeforeEnd, model: str,
               prompt_tokens: int) -> AsyncIterator[bytes]: ...


def encode(obj: dict[str, Any]) -> bytes:
    """A translated answer's JSON body, as compact as the gateway's own."""
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
