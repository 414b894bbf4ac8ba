"""`kind: openai`: any OpenAI-compatible server (tidegate backends, vLLM, SGLang, OpenAI itself), as is."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from config import Channel
from gateway.channels.kinds.kind import WireCall


class OpenAIKind:
    def call(self, channel: Channel, path: str, body: dict[str, Any]) -> WireCall:
        headers = {"authorization": f"Bearer {channel.api_key}"} if channel.api_key else {}
        return WireCall(channel.base_url.rstrip("/") + path, headers, body)

    def whole(self, status: int, body: bytes) -> bytes:
        return body

    def events(self, events: AsyncIterator[list[bytes]]) -> AsyncIterator[list[bytes]]:
        return events
