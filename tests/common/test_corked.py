"""The corked transport over a real TCP connection on 127.0.0.1: what is written arrives whole and in order."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from common.corked import FLUSH_BYTES, CorkedTransport


class Sink(asyncio.Protocol):
    def __init__(self) -> None:
        self.received = bytearray()
        self.closed = asyncio.get_running_loop().create_future()
        self.grown = asyncio.Event()

    def data_received(self, data: bytes) -> None:
        self.received += data
        self.grown.set()

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.closed.done():
            self.closed.set_result(None)


class Pair:
    def __init__(self, corked: CorkedTransport, raw: asyncio.Transport, sink: Sink) -> None:
        self.corked, self.raw, self.sink = corked, raw, sink


@pytest.fixture
async def pair() -> AsyncIterator[Pair]:
    loop = asyncio.get_running_loop()
    accepted: asyncio.Future[Sink] = loop.create_future()

    def accept() -> Sink:
        sink = Sink()
        accepted.set_result(sink)
        return sink

    server = await loop.create_server(accept, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    raw, _ = await loop.create_connection(asyncio.Protocol, "127.0.0.1", port)
    yield Pair(CorkedTransport(raw, loop), raw, await asyncio.wait_for(accepted, 5))
    raw.close()
    server.close()
    await server.wait_closed()


async def received(sink: Sink, size: int, timeout: float = 5.0) -> bytes:
    async with asyncio.timeout(timeout):
        while len(sink.received) < size:
            sink.grown.clear()
            await sink.grown.wait()
    return bytes(sink.received)


async def test_writes_of_a_turn_are_held_then_sent_in_order(pair: Pair) -> None:
    pair.corked.write(b"HTTP/1.1 200 OK\r\n\r\n")
    pair.corked.write(bytearray(b"body"))
    pair.corked.write(b"")
    assert pair.corked.get_write_buffer_size() == len(b"HTTP/1.1 200 OK\r\n\r\nbody")  # not yet on the socket
    assert await received(pair.sink, 23) == b"HTTP/1.1 200 OK\r\n\r\nbody"
    pair.corked.writelines([b"a", b"b"])
    assert await received(pair.sink, 25) == b"HTTP/1.1 200 OK\r\n\r\nbodyab"


async def test_close_sends_what_is_held_first(pair: Pair) -> None:
    pair.corked.write(b"last words")
    pair.corked.close()
    await asyncio.wait_for(pair.sink.closed, 5)
    assert bytes(pair.sink.received) == b"last words"
    assert pair.corked.is_closing()


async def test_write_eof_sends_what_is_held_first(pair: Pair) -> None:
    pair.corked.write(b"refused")
    assert pair.corked.can_write_eof()
    pair.corked.write_eof()
    await asyncio.wait_for(pair.sink.closed, 5)  # the peer saw the end of what was sent, and closed
    assert bytes(pair.sink.received) == b"refused"


async def test_abort_drops_what_is_held(pair: Pair) -> None:
    pair.corked.write(b"never sent")
    pair.corked.abort()
    await asyncio.wait_for(pair.sink.closed, 5)
    pair.corked.flush()  # as the flush the write scheduled does: it finds nothing to send
    assert bytes(pair.sink.received) == b""


async def test_the_rest_is_the_wrapped_transports(pair: Pair) -> None:
    assert pair.corked.get_extra_info("peername") == pair.raw.get_extra_info("peername")
    pair.corked.pause_reading()
    assert not pair.corked.is_reading()
    pair.corked.resume_reading()
    assert pair.corked.is_reading()


async def test_a_large_write_goes_on_at_once_and_meets_flow_control(pair: Pair) -> None:
    pair.corked.write(b"head")
    big = b"x" * FLUSH_BYTES
    pair.corked.write(big)
    assert pair.corked.get_write_buffer_size() == pair.raw.get_write_buffer_size()  # nothing held back
    pair.corked.write(b"tail")
    assert await received(pair.sink, len(big) + 8) == b"head" + big + b"tail"
