"""SSE framing, and the stream response that closes its events the moment the client leaves (both tiers)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncGenerator
from typing import Any

from common.event_stream import DONE_EVENT, EventStreamResponse, error_event, json_event
from common.openai_errors import unavailable


def test_an_event_is_one_data_line_and_a_blank_line() -> None:
    frame = json_event({"text": "héllo\nworld"})
    assert frame.startswith(b"data: ") and frame.endswith(b"\n\n") and frame.count(b"\n") == 2
    assert json.loads(frame[len(b"data: "):]) == {"text": "héllo\nworld"}
    assert DONE_EVENT == b"data: [DONE]\n\n"


def test_an_error_event_carries_the_openai_error_body() -> None:
    frame = error_event(unavailable("busy", 2.0, "overloaded")).decode()
    name, data = frame.rstrip("\n").split("\n")
    assert name == "event: error"
    assert json.loads(data.removeprefix("data: ")) == {
        "error": {"message": "busy", "type": "service_unavailable", "param": None, "code": "overloaded"}}


async def run_stream(events: AsyncGenerator[bytes, None], leave: asyncio.Event) -> list[dict[str, Any]]:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        await leave.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await EventStreamResponse(events)({"type": "http"}, receive, send)
    return sent


async def test_a_silent_stream_is_closed_as_soon_as_the_client_leaves() -> None:
    closed = asyncio.Event()

    async def silent() -> AsyncGenerator[bytes, None]:
        try:
            await asyncio.Event().wait()  # a request still queued: nothing to write yet
            yield b""
        finally:
            closed.set()

    leave = asyncio.Event()
    task = asyncio.create_task(run_stream(silent(), leave))
    await asyncio.sleep(0.01)
    assert not closed.is_set()
    leave.set()
    sent = await asyncio.wait_for(task, 5)
    assert closed.is_set()
    assert sent[0]["type"] == "http.response.start" and sent[0]["status"] == 200
    assert (b"content-type", b"text/event-stream; charset=utf-8") in sent[0]["headers"]


async def test_a_stream_that_ends_sends_every_event_then_closes_the_body() -> None:
    async def three() -> AsyncGenerator[bytes, None]:
        for i in range(3):
            yield json_event({"i": i})
        yield DONE_EVENT

    sent = await asyncio.wait_for(run_stream(three(), asyncio.Event()), 5)
    bodies = [m["body"] for m in sent[1:]]
    assert bodies[:4] == [json_event({"i": 0}), json_event({"i": 1}), json_event({"i": 2}), DONE_EVENT]
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
