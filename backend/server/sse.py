"""Server-sent events framing as OpenAI streams it: `data: {json}` events, `data: [DONE]`, `event: error`."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

from starlette.responses import Response
from starlette.types import Receive, Scope, Send

from backend.server.api_errors import ApiError

DONE = b"data: [DONE]\n\n"
HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}  # no proxy may buffer a token stream
MEDIA_TYPE = "text/event-stream"


def event(body: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(body, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


def error_event(err: ApiError) -> bytes:
    """A failure after the first byte: an `error` event the openai SDK raises as APIError, never a clean end."""
    data = json.dumps(err.body(), ensure_ascii=False, separators=(",", ":"))
    return f"event: error\ndata: {data}\n\n".encode()


async def wait_for_disconnect(receive: Receive) -> None:
    """Return once the client is gone; only valid after the request body was read in full."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return


class EventStreamResponse(Response):
    """An SSE response whose event iterator is closed (running its `finally`) as soon as the client leaves.

    Closing it at once, rather than at the next write, is what frees a silent request's KV blocks: a stream
    waiting on a slow prefill writes nothing for a while.
    """

    media_type = MEDIA_TYPE

    def __init__(self, events: AsyncGenerator[bytes, None], headers: dict[str, str] | None = None) -> None:
        self.events = events
        self.status_code = 200
        self.background = None
        self.init_headers({**HEADERS, **(headers or {})})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await send({"type": "http.response.start", "status": self.status_code, "headers": self.raw_headers})
        pump = asyncio.ensure_future(self._pump(send))
        watch = asyncio.ensure_future(wait_for_disconnect(receive))
        try:
            await asyncio.wait({pump, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (pump, watch):
                task.cancel()
            await asyncio.gather(pump, watch, return_exceptions=True)
            await self.events.aclose()

    async def _pump(self, send: Send) -> None:
        async for chunk in self.events:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})
