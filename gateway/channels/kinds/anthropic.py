"""`kind: anthropic`: an upstream that speaks Anthropic's Messages API; chat is translated there and back.

`base_url` is the API's root with its version (`https://api.anthropic.com/v1`); the channel's `api_key` goes in
`x-api-key`, its `api_version` (default 2023-06-01) in `anthropic-version`.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from config import Channel
from gateway.anthropic_wire import ChatChunks, chat_answer, chat_error, messages_request
from gateway.channels.kinds.kind import WireCall
from gateway.errors import invalid_request
from gateway.sse import DONE

ANTHROPIC_VERSION = "2023-06-01"
# Messages requires max_tokens; a chat request without one gets this many
DEFAULT_MAX_TOKENS = 4096


class AnthropicKind:
    def call(self, channel: Channel, path: str, body: dict[str, Any]) -> WireCall:
        if path != "/chat/completions":
            raise invalid_request("an anthropic channel serves chat completions only", "prompt")
        headers = {"anthropic-version": channel.api_version or ANTHROPIC_VERSION}
        if channel.api_key:
            headers["x-api-key"] = channel.api_key
        return WireCall(channel.base_url.rstrip("/") + "/messages", headers,
                        messages_request(body, DEFAULT_MAX_TOKENS))

    def whole(self, status: int, body: bytes) -> bytes:
        try:
            answer = json.loads(body)
        except (ValueError, RecursionError):
            return body  # not JSON: the gateway's reading of a broken answer applies as for any kind
        if not isinstance(answer, dict):
            return body
        try:
            return _encode(chat_answer(answer) if status < 300 else chat_error(answer))
        except (AttributeError, TypeError, ValueError):
            return b""  # not a Messages answer: the gateway answers 502, as for any unreadable body

    async def events(self, events: AsyncIterator[list[bytes]]) -> AsyncIterator[list[bytes]]:
        chunks = ChatChunks()
        async for batch in events:
            out: list[bytes] = []
            for data in batch:
                try:
                    event = json.loads(data)
                except (ValueError, RecursionError):
                    yield [*out, data]  # passed on as it came: the relay cuts a stream it cannot read
                    return
                try:
                    translated = chunks.add(event if isinstance(event, dict) else {})
                except (AttributeError, TypeError, ValueError):
                    if out:
                        yield out
                    return  # not a Messages event: ended without [DONE], the relay reports the stream cut
                out.extend(_encode(chunk) for chunk in translated)
                if isinstance(event, dict) and event.get("type") == "message_stop":
                    yield [*out, DONE]
                    return
            if out:
                yield out


def _encode(obj: dict[str, Any]) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
