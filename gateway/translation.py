"""What an API the gateway serves by translation to chat completions provides, one object per request: reading the
request (`read` of `Proxy.serve`, which also fills this object) and turning the answer back."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol

from gateway.relay import StreamRelay


class Translation(Protocol):
    async def answer(self, completion: dict[str, Any]) -> dict[str, Any]:
        """The client's answer for a whole chat completion (an upstream's, or one assembled from its stream)."""
        ...

    def events(self, relay: StreamRelay, before_end: Callable[[], Awaitable[None]]) -> AsyncIterator[bytes]:
        """The client's SSE events for the upstream's chat chunks (`relay.json_chunks()`); `before_end`, awaited
        once the chunks run out and before the last event, settles the request, and `relay.outcome` then says
        whether the upstream's stream failed."""
        ...
