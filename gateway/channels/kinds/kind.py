"""The one interface every channel kind implements."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from config import Channel


@dataclass(slots=True)
class WireCall:
    """One upstream HTTP request, before the gateway's own headers (content type, request id) are added."""

    url: str
    headers: dict[str, str]
    body: dict[str, Any]


class ChannelKind(Protocol):
    """Translates at the channel's edge, so that everything behind it speaks OpenAI chat.

    `call` turns an OpenAI body for `path` (`/chat/completions` or `/completions`) into the upstream's request,
    raising a 400 `ApiError` naming the field it cannot carry. `whole` reads a whole answer body (any status)
    back into OpenAI's shape; `events` turns the upstream's SSE payloads into OpenAI chunk payloads, ending with
    `[DONE]` when the upstream finished, batch by batch (a batch: the events of one upstream read).

        class Echo:
            def call(self, channel, path, body):
                return WireCall(channel.base_url + path, {}, body)
            def whole(self, status, body):
                return body
            def events(self, events):
                return events
    """

    def call(self, channel: Channel, path: str, body: dict[str, Any]) -> WireCall: ...

    def whole(self, status: int, body: bytes) -> bytes: ...

    def events(self, events: AsyncIterator[list[bytes]]) -> AsyncIterator[list[bytes]]: ...
