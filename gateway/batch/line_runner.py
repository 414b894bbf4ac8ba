"""Runs one batch line as an online request of the batch's key: the same path (`Proxy.serve`: admission, the
`batch` priority class, routing, retries, settlement and the usage ledger) and the same inbound wire as a client's
request to the line's endpoint, answered whole."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from starlette.requests import Request
from starlette.types import Message

from gateway.batch.lines import Line
from gateway.batch.shapes import new_id
from gateway.path.client_wire import ClientWire
from gateway.path.priority import PriorityPools
from gateway.path.proxy import Proxy
from quota import KeyInfo

WireFor = Callable[[], ClientWire]
# refusals that pass: the line is tried again later rather than answered with them
RETRIED_CODES = frozenset({"rate_limit_exceeded", "overloaded", "store_unavailable", "no_healthy_channel"})


@dataclass(slots=True, frozen=True)
class Answered:
    status: int
    body: Any  # the JSON answer, or the error object of a refusal
    request_id: str

    @property
    def retry_later(self) -> bool:
        if self.status not in (429, 503) or not isinstance(self.body, dict):
            return False
        error = self.body.get("error")
        return self.status == 503 or (isinstance(error, dict) and error.get("code") in RETRIED_CODES)


class LineRunner:
    def __init__(self, proxy: Proxy, pools: PriorityPools, wires: dict[str, WireFor]):
        self._proxy = proxy
        self._wires = wires
        # the batch class, or the least important one where no class is called `batch`
        self.priority_class = "batch" if "batch" in pools.pools else max(pools.pools.values(), key=lambda p: p.rank).name

    async def run(self, endpoint: str, line: Line, key: KeyInfo) -> Answered:
        request_id = new_id("batch_req_")
        body = json.dumps({**line.body, "priority": self.priority_class}).encode()
        response = await self._proxy.serve(_request(endpoint, body, request_id), self._wires[endpoint](), key=key)
        raw = bytes(response.body)
        try:
            answer = json.loads(raw) if raw else None
        except ValueError:
            answer = {"error": {"message": raw.decode(errors="replace")[:1000], "type": "server_error"}}
        return Answered(response.status_code, answer, request_id)


def _request(path: str, body: bytes, request_id: str) -> Request:
    """The line as an HTTP request whose body has arrived and whose client never leaves."""
    scope = {"type": "http", "http_version": "1.1", "method": "POST", "scheme": "http", "path": path,
             "raw_path": path.encode(), "root_path": "", "query_string": b"", "client": None,
             "server": ("batch", 0), "headers": [(b"content-type", b"application/json"),
                                                 (b"content-length", str(len(body)).encode()),
                                                 (b"x-request-id", request_id.encode())]}
    delivered = False

    async def receive() -> Message:
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.get_running_loop().create_future()  # cancelled by the path once the answer is in
        raise AssertionError("unreachable")

    return Request(scope, receive)
