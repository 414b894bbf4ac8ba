"""How one inbound API reads its requests and writes its answers around the one chat/completions path.

The OpenAI routes pass everything through as it is; other APIs (Anthropic's Messages) translate at this edge, so
auth, admission, priority, routing, retries, relay and settlement stay one path for all of them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from gateway.errors import ApiError
from gateway.openai_request import OpenAIRequest, parse
from gateway.relay import StreamRelay

BeforeEnd = Callable[[], Awaitable[None]]


class ClientWire(Protocol):
    """`chat` says which upstream API serves it (chat or legacy completions); `parse` turns the raw body into
    the OpenAI request served; `error_body`, `whole`, `answer` and `events` put every kind of answer back in the
    client's shape: an error, a whole upstream body (`whole`, any status), an assembled chat/completion object
    (`answer`), and a relayed stream (`events`, which runs `before_end` before its last event)."""

    chat: bool

    def parse(self, raw: bytes, *, classes: set[str], max_depth: int) -> OpenAIRequest: ...

    def error_body(self, error: ApiError) -> dict[str, Any]: ...

    def whole(self, status: int, body: bytes) -> tuple[int, bytes]: ...

    def answer(self, whole: dict[str, Any]) -> dict[str, Any]: ...

    def events(self, relay: StreamRelay, before_end: BeforeEnd, model: str,
               prompt_tokens: int) -> AsyncIterator[bytes]: ...


class OpenAIWire:
    """`/v1/chat/completions` and `/v1/completions`: the upstream's shapes are the client's."""

    def __init__(self, chat: bool):
        self.chat = chat

    def parse(self, raw: bytes, *, classes: set[str], max_depth: int) -> OpenAIRequest:
        return parse(raw, chat=self.chat, classes=classes, max_depth=max_depth)

    def error_body(self, error: ApiError) -> dict[str, Any]:
        return error.body()

    def whole(self, status: int, body: bytes) -> tuple[int, bytes]:
        return status, body

    def answer(self, whole: dict[str, Any]) -> dict[str, Any]:
        return whole

    def events(self, relay: StreamRelay, before_end: BeforeEnd, model: str,
               prompt_tokens: int) -> AsyncIterator[bytes]:
        return relay.stream(before_end)


CHAT = OpenAIWire(chat=True)
COMPLETIONS = OpenAIWire(chat=False)
