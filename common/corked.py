"""A transport that sends what one event-loop turn wrote to it in one system call.

uvicorn writes an answer's head and each body part to the socket as it goes: a whole answer costs two `send`s,
a stream one per part and one for its end. Held until the turn ends and joined, they cost one; the bytes, their
order and the moment they leave (before the loop next waits for I/O) are the same.
"""

from __future__ import annotations

import asyncio
from typing import Any

# held beyond this, a turn's writes go on at once: a producer that writes a lot without yielding still meets the
# socket's flow control (uvicorn waits for the drain once the transport pauses writing)
FLUSH_BYTES = 64 * 1024


class CorkedTransport:
    """Wraps a connection's transport: `write` gathers, a callback at the end of the turn flushes; `close` and
    `write_eof` flush first, `abort` drops what is held with the rest of the buffer."""

    __slots__ = ("_held", "_held_bytes", "_loop", "_scheduled", "_transport")

    def __init__(self, transport: asyncio.Transport, loop: asyncio.AbstractEventLoop) -> None:
        self._transport = transport
        self._loop = loop
        self._held: list[bytes] = []
        self._held_bytes = 0
        self._scheduled = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        if not data:
            return
        chunk = data if isinstance(data, bytes) else bytes(data)
        self._held.append(chunk)
        self._held_bytes += len(chunk)
        if self._held_bytes >= FLUSH_BYTES:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._loop.call_soon(self._turn_ended)

    def writelines(self, list_of_data: Any) -> None:
        for data in list_of_data:
            self.write(data)

    def _turn_ended(self) -> None:
        self._scheduled = False
        self.flush()

    def flush(self) -> None:
        held = self._held
        if not held:
            return
        self._held = []
        self._held_bytes = 0
        if self._transport.is_closing():
            return  # gone or aborted: asyncio would only warn about writes to a closed socket
        self._transport.write(held[0] if len(held) == 1 else b"".join(held))

    def close(self) -> None:
        self.flush()
        self._transport.close()

    def write_eof(self) -> None:
        self.flush()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = []
        self._held_bytes = 0
        self._transport.abort()

    def can_write_eof(self) -> bool:
        return self._transport.can_write_eof()

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def get_write_buffer_size(self) -> int:
        return self._transport.get_write_buffer_size() + self._held_bytes

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return self._transport.get_extra_info(name, default)

    def __getattr__(self, name: str) -> Any:
        # reading, flow control, the protocol: the wrapped transport's own (not a subclass of asyncio.Transport,
        # whose stubs would answer these with NotImplementedError instead of reaching here)
        return getattr(self._transport, name)
