"""Reading an upstream's server-sent events: split raw bytes into events, and tell content from framing.

Writing them is `common.event_stream`'s, shared with the backend.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

DONE = b"[DONE]"


async def split_events(chunks: AsyncIterator[bytes]) -> AsyncIterator[list[bytes]]:
    """Yield the `data` payloads of the events each read completed, together, as soon as they have arrived.

    One batch per read, not one item per event: a fast upstream sends a whole answer in a read or two, and
    everything downstream (deadlines, writes to the client) then costs once per read instead of once per event.
    """
    pending = b""
    async for chunk in chunks:
        pending += chunk.replace(b"\r\n", b"\n") if b"\r" in chunk else chunk
        if b"\n\n" not in pending:
            continue
        *events, pending = pending.split(b"\n\n")
        batch = [data for event in events if (data := _data_of(event)) is not None]
        if batch:
            yield batch


def _data_of(event: bytes) -> bytes | None:
    if event.startswith(b"data:") and b"\n" not in event:  # the common case: one data line
        return event[5:].lstrip(b" ")
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
