"""Server-sent events as OpenAI streams them, and an SSE response that ends as soon as the client leaves or stops
reading, saying which of those happened.

Plain Starlette, for both tiers. Starlette's StreamingResponse learns of a disconnect only at its next write, and
a write to a client that stopped reading waits forever; either would hold what the stream holds (a priority
slot, a reservation, KV blocks) past every deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from enum import StrEnum
from typing import Any

from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from common import fast_json
from common.openai_errors import ApiError

HEADERS = {"cache-control": "no-cache", "x-accel-buffering": "no"}  # no proxy may buffer a token stream
MEDIA_TYPE = "text/event-stream"
# a write that starts after the deadline (the closing error event) still gets this long to reach the client
FINAL_WRITE_GRACE = 1.0
# scope["extensions"][ABORT] = {"abort": callable} when the server can drop a connection at once; without it a
# stream cut at its deadline is left to the server, which may keep the socket until its buffer drains
ABORT = "tidegate.abort"


def data_event(data: bytes) -> bytes:
    """One event carrying `data`: a JSON text, or `[DONE]`."""
    return b"data: " + data + b"\n\n"


def json_event(obj: Any) -> bytes:
    return data_event(fast_json.dumps(obj))


def named_event(name: str, obj: Any) -> bytes:
    """An event whose type is in its `event:` line, as Anthropic's and the Responses API's streams send them."""
    return f"event: {name}\n".encode() + json_event(obj)


def error_event(error: ApiError) -> bytes:
    """A failure after the first byte: an `error` event the openai SDK raises as APIError, never a clean end."""
    return named_event("error", error.body())


DONE_EVENT = data_event(b"[DONE]")


class StreamEnd(StrEnum):
    """Why an event stream stopped."""

    finished = "finished"  # every event was written
    disconnected = "disconnected"  # the client went away
    write_timeout = "write_timeout"  # the client stopped reading and the deadline passed


class EventStreamResponse(Response):
    """Writes `events` as they come; `on_close`, if given, runs exactly once with how the stream ended.

    `deadline` (a `time.monotonic()` instant) bounds the whole response, writes included: a write still blocked
    on a client that stopped reading is abandoned then, and the server closes the connection.
    """

    media_type = MEDIA_TYPE

    def __init__(self, events: AsyncIterator[bytes], headers: dict[str, str] | None = None, *,
                 deadline: float | None = None,
                 on_close: Callable[[StreamEnd], Awaitable[None]] | None = None) -> None:
        # no `body` attribute: init_headers then leaves out Content-Length, as StreamingResponse does
        self.status_code = 200
        self.background = None
        self.init_headers({**HEADERS, **(headers or {})})
        self.events = events
        self.deadline = deadline
        self._on_close = on_close

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        pump = asyncio.create_task(self._pump(send))
        watch = asyncio.create_task(wait_for_disconnect(receive))
        end = StreamEnd.write_timeout  # unless the pump or the watch finishes first
        try:
            done, _ = await asyncio.wait({pump, watch}, timeout=self._time_left(FINAL_WRITE_GRACE),
                                         return_when=asyncio.FIRST_COMPLETED)
            if pump in done:
                try:
                    end = pump.result()
                except OSError:  # uvicorn's ClientDisconnected on a write to a closed socket
                    end = StreamEnd.disconnected
            elif watch in done:
                end = StreamEnd.disconnected
        finally:
            for task in (pump, watch):
                task.cancel()
            await asyncio.gather(pump, watch, return_exceptions=True)
            abort = scope.get("extensions", {}).get(ABORT, {}).get("abort")
            if end is StreamEnd.write_timeout and abort is not None:
                abort()  # a client that stopped reading would never let the buffered answer drain
            aclose = getattr(self.events, "aclose", None)
            if aclose is not None:
                with contextlib.suppress(Exception):
                    await aclose()
            if self._on_close is not None:
                await asyncio.shield(self._on_close(end))

    async def _pump(self, send: Send) -> StreamEnd:
        try:
            await self._write(send, {"type": "http.response.start", "status": self.status_code,
                                     "headers": self.raw_headers})
            async for chunk in self.events:
                await self._write(send, {"type": "http.response.body", "body": chunk, "more_body": True})
            await self._write(send, {"type": "http.response.body", "body": b"", "more_body": False})
        except TimeoutError:
            return StreamEnd.write_timeout
        return StreamEnd.finished

    async def _write(self, send: Send, message: Message) -> None:
        async with asyncio.timeout(self._time_left(0.0)):
            await send(message)

    def _time_left(self, grace: float) -> float | None:
        """Seconds until the deadline (plus `grace`), never less than the final write's grace."""
        if self.deadline is None:
            return None
        return max(self.deadline + grace - time.monotonic(), FINAL_WRITE_GRACE)


async def wait_for_disconnect(receive: Receive) -> None:
    """Return once the client is gone; only valid after the request body was read in full."""
    while (await receive())["type"] != "http.disconnect":
        pass
