"""A small HTTP/1.1 client for the gateway's upstream calls: a POST out, its answer read as it arrives.

The gateway's hot path needs little of a general client (no cookies, redirects, proxies, auth flows or
multipart), and paid for all of it per request: this one writes a request in one send, parses the answer with
httptools (the parser uvicorn serves with) straight from an asyncio protocol, and keeps connections alive in a
pool per origin. What it does keep: TLS for https origins, a connect deadline, bodies framed by length, by
chunks or by the connection's end, gzip and deflate decoding (an upstream that compresses although asked for
identity), flow control on a reader that lags, and no reuse of a connection whose answer was not read whole.
"""

from __future__ import annotations

import asyncio
import ssl
import time
import zlib
from collections import deque
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import cast
from urllib.parse import quote, urlsplit

import httptools

# held beyond this unread, the socket stops being read until the reader catches up
READ_AHEAD_BYTES = 1 << 20
# past this without the end of an answer's headers (aiohttp allowed 8190 bytes a line), the upstream is broken:
# not a reason to hold ever more of it
MAX_HEAD_BYTES = 64 * 1024
KEEPALIVE_SECONDS = 30.0


class HttpClientError(Exception):
    """The upstream could not be reached, or its answer could not be read."""


class ConnectFailed(HttpClientError):
    """No connection: refused, unresolvable, or its TLS handshake failed."""


class ConnectTimeout(HttpClientError, TimeoutError):
    """No connection within the connect deadline."""


class AnswerBroken(HttpClientError):
    """The connection broke, or the answer was not HTTP/1.1 this client can read."""


@dataclass(slots=True, frozen=True)
class Origin:
    scheme: str
    host: str
    port: int

    @property
    def host_header(self) -> bytes:
        default = 443 if self.scheme == "https" else 80
        host = f"[{self.host}]" if ":" in self.host else self.host
        return (host if self.port == default else f"{host}:{self.port}").encode()


class _Connection(asyncio.Protocol):
    """One keep-alive connection: an answer at a time, its body chunks queued for the reader."""

    def __init__(self, origin: Origin) -> None:
        self.origin = origin
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self.idle_since = 0.0
        self._answer: HttpAnswer | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's transports are not asyncio's subclasses

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True
        if self._answer is not None:
            self._answer._ended_by_close()

    def data_received(self, data: bytes) -> None:
        answer = self._answer
        if answer is None:  # nothing was asked: a server that talks out of turn is not reused
            self.close()
            return
        answer._feed(data)

    def eof_received(self) -> bool | None:
        return None  # close: a half-closed connection is never reused

    def pause_writing(self) -> None:  # a request is one write of a small body: nothing to pause
        pass

    def resume_writing(self) -> None:
        pass

    def start(self, answer: HttpAnswer) -> None:
        self._answer = answer

    def finish(self) -> None:
        self._answer = None

    def close(self) -> None:
        self.lost = True
        if self.transport is not None:
            self.transport.close()


class HttpAnswer:
    """An answer whose head has arrived; its body is read whole (`read`) or as it comes (`chunks`). End it with
    `release` (its connection goes back to the pool if the body was read whole) or `close`."""

    def __init__(self, client: HttpClient, connection: _Connection) -> None:
        self.status = 0
        self.headers: dict[str, str] = {}  # lower-cased names; a repeated header keeps its last value
        self._client = client
        self._connection = connection
        self._parser: httptools.HttpResponseParser | None = httptools.HttpResponseParser(self)
        self._names: list[bytes] = []
        self._values: list[bytes] = []
        self._head_bytes = 0
        self._chunks: deque[bytes] = deque()
        self._buffered = 0
        self._paused = False
        self._head: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiter: asyncio.Future[None] | None = None
        self._complete = False
        self._keep_alive = False
        self._error: HttpClientError | None = None
        self._until_close = False  # no length and no chunks: the body ends with the connection
        self._decoder: zlib._Decompress | None = None
        self._done = False

    @property
    def content_type(self) -> str:
        value = self.headers.get("content-type")
        return value.split(";", 1)[0].strip().lower() if value else "application/octet-stream"

    async def read(self) -> bytes:
        return b"".join([chunk async for chunk in self.chunks()])

    async def chunks(self) -> AsyncIterator[bytes]:
        """The body's (decoded) bytes as they arrive, each read's worth at once."""
        while True:
            if self._chunks:
                out = b"".join(self._chunks) if len(self._chunks) > 1 else self._chunks[0]
                self._chunks.clear()
                self._buffered = 0
                if self._paused and self._connection.transport is not None:
                    self._paused = False
                    self._connection.transport.resume_reading()
                yield out
                continue
            if self._error is not None:
                raise self._error
            if self._complete:
                return
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None

    def release(self) -> None:
        """Done with the answer: its connection is reused only if the whole body arrived (read or not)."""
        if self._done:
            return
        self._done = True
        self._parser = None  # it refers back to this answer: no cycle is left for the garbage collector
        connection = self._connection
        connection.finish()
        if self._complete and self._error is None and self._keep_alive:
            self._client._put_back(connection)
        else:
            connection.close()

    def close(self) -> None:
        if self._done:
            return
        self._done = True
        self._parser = None
        self._connection.finish()
        self._connection.close()

    # the protocol's side
    def _feed(self, data: bytes) -> None:
        if self._parser is None:
            return
        if not self._head.done():
            if self._head_bytes > MAX_HEAD_BYTES:  # read before this one, and the head has not ended
                self._fail(AnswerBroken("the answer's head is too large"))
                self._connection.close()
                return
            self._head_bytes += len(data)
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._fail(AnswerBroken(f"unreadable answer: {type(exc).__name__}"))
            self._connection.close()

    def _ended_by_close(self) -> None:
        if self._head.done() and self._until_close and not self._complete:
            self._end_body()
        elif not self._complete:
            self._fail(AnswerBroken("the connection closed before the answer ended"))

    def _fail(self, error: HttpClientError) -> None:
        if self._error is None and not self._complete:
            self._error = error
        if not self._head.done():
            self._head.set_exception(error)
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _end_body(self) -> None:
        if self._decoder is not None:
            try:
                tail = self._decoder.flush()
            except zlib.error:
                self._fail(AnswerBroken("the compressed body does not decode"))
                return
            if tail:
                self._chunks.append(tail)
        self._complete = True
        self._wake()

    # httptools' callbacks
    def on_header(self, name: bytes, value: bytes) -> None:
        self._names.append(name)
        self._values.append(value)

    def on_headers_complete(self) -> None:
        assert self._parser is not None
        self.status = self._parser.get_status_code()
        headers = self.headers
        for name, value in zip(self._names, self._values, strict=True):
            headers[name.decode("latin-1").lower()] = value.decode("latin-1")
        encoding = headers.get("content-encoding", "").strip().lower()
        if encoding in ("gzip", "x-gzip"):
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._decoder = zlib.decompressobj(zlib.MAX_WBITS)
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        self._until_close = not chunked and "content-length" not in headers and self.status not in (204, 304)
        if not self._head.done():
            self._head.set_result(None)

    def on_body(self, body: bytes) -> None:
        if self._decoder is not None:
            try:
                body = self._decoder.decompress(body)
            except zlib.error:
                self._fail(AnswerBroken("the compressed body does not decode"))
                self._connection.close()
                return
            if not body:
                return
        self._chunks.append(body)
        self._buffered += len(body)
        if self._buffered > READ_AHEAD_BYTES and not self._paused and self._connection.transport is not None:
            self._paused = True
            self._connection.transport.pause_reading()
        self._wake()

    def on_message_complete(self) -> None:
        self._until_close = False
        assert self._parser is not None
        self._keep_alive = self._parser.should_keep_alive()  # the parser forgets once this callback returns
        self._end_body()


class HttpClient:
    """POSTs to upstreams over pooled keep-alive connections, one pool per origin, without a size limit."""

    def __init__(self, keepalive: float = KEEPALIVE_SECONDS, ssl_context: ssl.SSLContext | None = None) -> None:
        self._keepalive = keepalive
        self._ssl = ssl_context
        self._idle: dict[Origin, list[_Connection]] = {}
        self._targets: dict[str, tuple[Origin, bytes]] = {}
        self._closed = False

    async def post(self, url: str, body: bytes, headers: dict[str, str], *, connect: float) -> HttpAnswer:
        """Sends the request and returns once the answer's head has arrived; the caller bounds that wait."""
        origin, target = self._target(url)
        lines = [b"POST ", target, b" HTTP/1.1\r\nhost: ", origin.host_header, b"\r\n"]
        for name, value in headers.items():
            if "\r" in name or "\n" in name or "\r" in value or "\n" in value:
                raise ValueError(f"a header may not hold a line break: {name!r}")
            lines += (name.encode(), b": ", value.encode(), b"\r\n")
        lines += (b"content-length: ", str(len(body)).encode(), b"\r\n\r\n", body)
        connection = self._reused(origin) or await self._connect(origin, connect)
        answer = HttpAnswer(self, connection)
        connection.start(answer)
        assert connection.transport is not None
        connection.transport.write(b"".join(lines))
        try:
            await answer._head
        except BaseException:
            answer.close()
            raise
        return answer

    async def close(self) -> None:
        self._closed = True
        for connections in self._idle.values():
            for connection in connections:
                connection.close()
        self._idle.clear()

    def _target(self, url: str) -> tuple[Origin, bytes]:
        known = self._targets.get(url)
        if known is None:
            parts = urlsplit(url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise ValueError(f"not an http(s) URL: {url!r}")
            port = parts.port or (443 if parts.scheme == "https" else 80)
            # percent-encoded as a URL library would, what is already encoded kept as it is
            path = quote(parts.path or "/", safe="/%:@!$&'()*+,;=~")
            target = path + (f"?{quote(parts.query, safe='/%:@!$&()*+,;=~?')}" if parts.query else "")
            known = (Origin(parts.scheme, parts.hostname, port), target.encode())
            if len(self._targets) < 1024:  # channel URLs are few; anything else is not worth keeping
                self._targets[url] = known
        return known

    def _reused(self, origin: Origin) -> _Connection | None:
        idle = self._idle.get(origin)
        if not idle:
            return None
        stale_before = time.monotonic() - self._keepalive
        while idle:
            connection = idle.pop()
            if not connection.lost and connection.idle_since > stale_before:
                return connection
            connection.close()
        return None

    async def _connect(self, origin: Origin, deadline: float) -> _Connection:
        loop = asyncio.get_running_loop()
        tls: ssl.SSLContext | None = None
        if origin.scheme == "https":
            tls = self._ssl = self._ssl or ssl.create_default_context()
        try:
            async with asyncio.timeout(deadline):
                _, connection = await loop.create_connection(lambda: _Connection(origin), origin.host, origin.port,
                                                             ssl=tls)
        except TimeoutError as exc:
            raise ConnectTimeout(f"no connection to {origin.host}:{origin.port} in {deadline:g} s") from exc
        except OSError as exc:
            raise ConnectFailed(f"cannot connect to {origin.host}:{origin.port}: {type(exc).__name__}") from exc
        return connection

    def _put_back(self, connection: _Connection) -> None:
        if self._closed or connection.lost:
            connection.close()
            return
        connection.idle_since = time.monotonic()
        self._idle.setdefault(connection.origin, []).append(connection)
