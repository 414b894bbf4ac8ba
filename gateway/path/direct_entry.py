"""The gateway's ASGI entry: every HTTP request meets its client address and the IP limit here, and an inference
request (a POST to one of the fixed inference paths) goes straight to its endpoint, past Starlette's middleware and
router layers (a wrapped `send` and a call frame each, every request); everything else takes Starlette's way.

The direct way answers exactly as Starlette's would: an `HTTPException` through its handler, any other error
through the app's `Exception` handler (logged, a 500 in the OpenAI shape when nothing was sent yet) and then
raised on to the server, as Starlette's `ServerErrorMiddleware` does.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import Message, Receive, Scope, Send

from config import IpRateLimit
from gateway.path.client_address import IpNetwork, with_client
from gateway.path.ip_limit import IpWindow, ip_refusal

Endpoint = Callable[[Request], Awaitable[Response]]
Handler = Callable[[Request, Exception], Awaitable[Response]]


class GatewayApp(Starlette):
    """Starlette, entered through the client address and the IP limit, with `direct` endpoints by exact path."""

    def __init__(self, *, trusted: Sequence[IpNetwork], ip_limit: IpRateLimit | None, internal_error: Handler,
                 routing_error: Handler) -> None:
        super().__init__(exception_handlers={Exception: internal_error, HTTPException: routing_error})
        self.trusted = list(trusted)
        # before anything else, so that a flood never reaches auth
        self.ip_window = IpWindow(ip_limit) if ip_limit is not None else None
        self.direct: dict[str, Endpoint] = {}  # POST paths, filled when the gateway starts
        self._internal_error = internal_error
        self._routing_error = routing_error

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope = with_client(scope, self.trusted)  # every reader of scope["client"] sees the one address
            if self.ip_window is not None and (refusal := ip_refusal(self.ip_window, scope)) is not None:
                await refusal(scope, receive, send)
                return
            if scope["method"] == "POST" and (endpoint := self.direct.get(scope["path"])) is not None:
                await self._serve(endpoint, scope, receive, send)
                return
        await super().__call__(scope, receive, send)

    async def _serve(self, endpoint: Endpoint, scope: Scope, receive: Receive, send: Send) -> None:
        scope["app"] = self
        scope["router"] = self.router
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        request = Request(scope, receive, sending)
        try:
            response = await endpoint(request)
            await response(scope, receive, sending)
        except HTTPException as exc:
            if started:
                raise RuntimeError("Caught handled exception, but response already started.") from exc
            await (await self._routing_error(request, exc))(scope, receive, send)
        except Exception as exc:
            answer = await self._internal_error(Request(scope), exc)
            if not started:
                await answer(scope, receive, send)
            raise

