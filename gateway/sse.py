"""Server-sent events as the relay needs them: split raw bytes into events, and read or write one."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

DONE = b"[DONE]"


async def split_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """Yield each event's `data` payload as soon as its closing blank line has arrived."""
    pending = b""
    async for chunk in chunks:
        pending += chunk.replace(b"\r\n", b"\n") if b"\r" in chunk else chunk
        while True:
            end = pending.find(b"\n\n")
            if end < 0:
                break
            event, pending = pending[:end], pending[end + 2 :]
            data = _data_of(event)
            if data is not None:
                yield data


def _data_of(event: bytes) -> bytes | None:
    lines = [line[5:].lstrip(b" ") for line in event.split(b"\n") if line.startswith(b"data:")]
    return b"\n".join(lines) if lines else None


def encode(data: bytes) -> bytes:
    return b"data: " + data + b"\n\n"


def encode_json(obj: Any) -> bytes:
    return encode(json.dumps(obj, separators=(",", ":")).encode())


def error_event(message: str, kind: str, code: str) -> bytes:
    """The event the openai SDK raises on (`event: error`), so a cut stream never ends silently."""
    body = {"error": {"message": message, "type": kind, "param": None, "code": code}}
    return b"event: error\n" + encode_json(body)


def has_content(chunk: dict[str, Any]) -> bool:
    """Whether a streamed chunk carries generated output (the first token, for the first-token deadline)."""
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if choice.get("text") or delta.get("content") or delta.get("tool_calls") or delta.get("refusal"):
            return True
        if choice.get("finish_reason") is not None:
            return True
    return False
