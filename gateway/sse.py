"""Reading an upstream's server-sent events: split raw bytes into events, and tell content from framing.

Writing them is `common.event_stream`'s, shared with the backend.
"""

from __future__ import annotations

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


def has_content(chunk: dict[str, Any]) -> bool:
    """Whether a streamed chunk carries generated output (the first token, for the first-token deadline)."""
    for choice in chunk.get("choices") or ():
        delta = choice.get("delta") or {}
        if choice.get("text") or delta.get("content") or delta.get("tool_calls") or delta.get("refusal"):
            return True
        if choice.get("finish_reason") is not None:
            return True
    return False
