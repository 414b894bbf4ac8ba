"""The limits a reverse proxy would otherwise enforce, kept by the HTTP protocol itself (uvicorn's httptools one).

Before a request's headers are complete no app code runs, so only the protocol can cut a client that sends
headers slowly, sends too many of them, or holds a connection open without sending anything. A server uses it
with `uvicorn.Config(app, http=GuardedHttpProtocol)` and sets `app.state.connection_guard`, whose counts then
say what the guard did.
"""

from __future__ import annotations

import asyncio
import http
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from common.corked import CorkedTransport
from common.event_stream import ABORT
from common.openai_errors import ApiError

# after a refusal the rest of what the client sends is read and dropped this long, so that closing with unread
# data (a TCP reset) cannot destroy the refusal before the client has read it
LINGER = 1.0


@dataclass(slots=True, frozen=True)
class ConnectionLimits:
    """Per worker process; the defaults are what `tidegate gateway` ships with."""

    header_timeout: float = 10.0  # from connect, or from the previous answer, to the last header
    max_header_bytes: int = 32 * 1024  # request line and headers together
    max_connections: int = 2048  # at the cap the longest-idle connection makes room; if none is idle, 503


@dataclass(slots=True)
class ConnectionGuard:
    """One app's limits, and what the guard did in this process: open connections, closes by reason."""

    limits: ConnectionLimits = field(default_factory=ConnectionLimits)
    open: int = 0
    # header_timeout, idle, made_room, headers_too_large, too_many_connections, invalid_http_request,
    # body_after_answer
    closed: Counter[str] = field(default_factory=Counter)


UNCONFIGURED = ConnectionGuard()


def guard_of(app: Any) -> ConnectionGuard:
    """The guard set on the app's state, looked up through the middleware uvicorn wraps around it."""
    while app is not None:
        guard = getattr(getattr(app, "state", None), "connection_guard", None)
        if isinstance(guard, ConnectionGuard):
            return guard
        app = getattr(app, "app", None)
    return UNCONFIGURED


class GuardedHttpProtocol(HttpToolsProtocol):
    """uvicorn's HTTP/1.1 protocol with a header deadline, a header size cap and a connection cap.

    A connection is idle from when it opens (or its last answer ends) until its next request's headers are
    complete; only idle connections time out or make room, so a request in progress is never cut here (its
    body and answer have their own deadlines in the app).
    """

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        # an answer's head and body parts leave in one send per loop turn (flow control stays on the socket's)
        self.transport = cast(asyncio.Transport, CorkedTransport(transport, self.loop))
        self._guard = guard_of(self.app)
        self._guard.open += 1
        self._limits = self._guard.limits
        self._timer: asyncio.TimerHandle | None = None
        self.refusing = False  # answered and lingering before the close: no longer a connection to count
        self._parse_refusal: ApiError | None = None
        self._await_headers(self.loop.time())
        if len(self.connections) > self._limits.max_connections and not self._make_room():
            self._refuse(ApiError(503, "the server has too many open connections; retry shortly",
                                  "service_unavailable", "too_many_connections", None, {"retry-after": "1"}))

    def connection_lost(self, exc: Exception | None) -> None:
        self._guard.open -= 1
        self._cancel_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self.refusing:
            return  # lingering after a refusal: drop the rest
        if self._waiting_headers:
            self._header_bytes += len(data)
        super().data_received(data)
        if self._waiting_headers and self._header_bytes > self._limits.max_header_bytes and not self.refusing:
            self._refuse(self._too_large())

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._waiting_headers = True  # a pipelined request begins while the one before is still answered

    def on_headers_complete(self) -> None:
        size = len(self.url) + sum(len(name) + len(value) + 4 for name, value in self.headers)
        if size > self._limits.max_header_bytes:
            self._parse_refusal = self._too_large()
            raise ValueError("headers too large")  # httptools stops parsing; uvicorn calls send_400_response
        self._waiting_headers = False
        self._header_bytes = 0
        self._cancel_timer()
        self.scope["extensions"] = {**self.scope.get("extensions", {}), ABORT: {"abort": self.transport.abort}}
        super().on_headers_complete()

    def on_response_complete(self) -> None:
        pipelined = bool(self.pipeline)
        unread_body = self.cycle is not None and self.cycle.more_body
        super().on_response_complete()
        if pipelined or self.transport.is_closing():
            return
        if unread_body:  # answered before the body ended (a 401): the rest may only trickle in until the deadline
            self._cancel_timer()
            self._timer = self.loop.call_later(self._limits.header_timeout, self._close, "body_after_answer")
            return
        self._await_headers(self.loop.time())

    def send_400_response(self, msg: str) -> None:
        """uvicorn's answer to what httptools cannot parse, in the OpenAI error shape."""
        self._refuse(self._parse_refusal or ApiError(400, "the request is not valid HTTP/1.1",
                                                     "invalid_request_error", "invalid_http_request"))

    @property
    def idle(self) -> bool:
        """Waiting for a request's headers with no answer in progress (a pipelined request is not idle)."""
        return self._waiting_headers and (self.cycle is None or self.cycle.response_complete)

    def _await_headers(self, since: float) -> None:
        self._waiting_headers = True
        self._header_bytes = 0
        self.idle_since = since
        self._cancel_timer()
        self._timer = self.loop.call_at(since + self._limits.header_timeout, self._headers_late)

    def _headers_late(self, reason: str | None = None) -> None:
        self._timer = None
        if self.transport.is_closing():
            return
        if self._header_bytes:
            self._refuse(ApiError(408, f"the request headers did not arrive within "
                                       f"{self._limits.header_timeout:g}s", "invalid_request_error",
                                  "request_timeout"), reason or "header_timeout")
        else:
            self._close(reason or "idle")  # nothing was asked, nothing to answer

    def _make_room(self) -> bool:
        """Close the connection idle the longest to admit this one; False when every other one is busy."""
        others = [c for c in self.connections if c is not self and not _leaving(c)]
        if len(others) < self._limits.max_connections:
            return True  # the count still includes connections that are closing
        idle = [c for c in others if isinstance(c, GuardedHttpProtocol) and c.idle]
        if not idle:
            return False
        oldest = min(idle, key=lambda c: c.idle_since)
        oldest._headers_late("made_room")
        return True

    def _too_large(self) -> ApiError:
        return ApiError(431, f"the request headers exceed {self._limits.max_header_bytes} bytes",
                        "invalid_request_error", "headers_too_large")

    def _close(self, reason: str) -> None:
        self._guard.closed[reason] += 1
        self.transport.close()

    def _refuse(self, error: ApiError, reason: str | None = None) -> None:
        """Answer `error` as JSON and close, without a request ever reaching the app."""
        self._guard.closed[reason or error.code or str(error.status)] += 1
        self.refusing = True
        self._cancel_timer()
        body = json.dumps(error.body(), separators=(",", ":")).encode()
        head = [f"HTTP/1.1 {error.status} {http.HTTPStatus(error.status).phrase}",
                "content-type: application/json", f"content-length: {len(body)}", "connection: close",
                *(f"{name}: {value}" for name, value in error.headers.items())]
        self.transport.write("\r\n".join(head).encode() + b"\r\n\r\n" + body)
        if self.transport.can_write_eof():
            self.transport.write_eof()
        self.loop.call_later(LINGER, self.transport.close)

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


def _leaving(connection: Any) -> bool:
    return bool(connection.transport.is_closing() or getattr(connection, "refusing", False))
