"""HTTP/1.1 over a bare socket, for clients no library would be: slow, silent, oversized, or not reading."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class RawAnswer:
    status: int
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


async def connect(port: int, receive_buffer: int | None = None
                  ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """A connection to the loopback port; `receive_buffer` shrinks the kernel's buffer for a client that stalls."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    if receive_buffer is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, ("127.0.0.1", port))
    return await asyncio.open_connection(sock=sock, limit=1 << 20)


def request_head(method: str, path: str, headers: dict[str, str], body: bytes = b"") -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "host: 127.0.0.1", *(f"{k}: {v}" for k, v in headers.items())]
    if body:
        lines.append(f"content-length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


async def read_answer(reader: asyncio.StreamReader) -> RawAnswer:
    """One whole answer with a Content-Length body (every refusal and JSON answer of the gateway)."""
    head = await reader.readuntil(b"\r\n\r\n")
    status_line, *lines = head.decode("latin-1").strip().split("\r\n")
    headers = {}
    for line in lines:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    body = await reader.readexactly(int(headers.get("content-length", "0")))
    return RawAnswer(int(status_line.split()[1]), headers, body)


async def closed_by_server(reader: asyncio.StreamReader) -> bool:
    """Whether the server has closed the connection (reads until EOF or a reset)."""
    try:
        while await reader.read(65536):
            pass
    except ConnectionError:
        pass
    return True


def close_quietly(writer: asyncio.StreamWriter) -> None:
    with contextlib.suppress(OSError, RuntimeError):
        writer.close()


async def answer_to_trickled_headers(port: int, byte_every: float, timeout: float) -> RawAnswer:
    """The answer to headers sent one byte every `byte_every` seconds and never finished: a client that is
    never idle yet never done, which only a header deadline stops."""
    reader, writer = await connect(port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: x\r\nx-slow: ")

    async def trickle() -> None:
        while True:
            writer.write(b"a")
            await asyncio.sleep(byte_every)

    sender = asyncio.create_task(trickle())
    try:
        return await asyncio.wait_for(read_answer(reader), timeout)
    finally:
        sender.cancel()
        close_quietly(writer)
