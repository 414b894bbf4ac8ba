"""Scripted Azure OpenAI and Anthropic upstreams on loopback: they record the requests they receive and answer
in their own wire format, streamed or whole."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.gateway.upstreams import serve_in_loop, stop_in_loop
from tests.servers import free_port

WORDS = ["Hel", "lo", " there"]
USAGE_IN, USAGE_OUT = 21, len(WORDS)


@dataclass(slots=True)
class Received:
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class KindUpstream:
    """`kind` is azure (OpenAI bodies at a deployment's path) or anthropic (Messages at /v1/messages)."""

    kind: str
    port: int = field(default_factory=free_port)
    received: list[Received] = field(default_factory=list)
    _server: uvicorn.Server | None = None
    _task: asyncio.Task[None] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}" + ("/v1" if self.kind == "anthropic" else "")

    async def start(self) -> KindUpstream:
        deployment = "/openai/deployments/{deployment}"
        routes = [Route("/v1/messages", self._messages, methods=["POST"])] if self.kind == "anthropic" else [
            Route(f"{deployment}/chat/completions", self._azure, methods=["POST"]),
            Route(f"{deployment}/embeddings", self._embed, methods=["POST"])]
        self._server, self._task = await serve_in_loop(Starlette(routes=routes), self.port)
        return self

    async def stop(self) -> None:
        await stop_in_loop(self._server, self._task)

    async def _record(self, request: Request) -> dict[str, Any]:
        body = await request.json()
        self.received.append(Received(request.url.path, dict(request.query_params), dict(request.headers), body))
        return dict(body)

    async def _azure(self, request: Request) -> Response:
        body = await self._record(request)
        usage = {"prompt_tokens": USAGE_IN, "completion_tokens": USAGE_OUT, "total_tokens": USAGE_IN + USAGE_OUT}
        base = {"id": "chatcmpl-az", "created": 1, "model": "gpt-4o-2024-08-06"}
        if not body.get("stream"):
            message = {"role": "assistant", "content": "".join(WORDS)}
            return JSONResponse({**base, "object": "chat.completion", "usage": usage,
                                 "choices": [{"index": 0, "message": message, "finish_reason": "stop"}]})
        chunk = {**base, "object": "chat.completion.chunk"}
        deltas = [{"role": "assistant", "content": ""}, *({"content": w} for w in WORDS)]
        events = [{**chunk, "choices": [{"index": 0, "delta": d, "finish_reason": None}]} for d in deltas]
        events.append({**chunk, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            events.append({**chunk, "choices": [], "usage": usage})
        return _sse([(None, e) for e in events] + [(None, "[DONE]")])

    async def _embed(self, request: Request) -> Response:
        await self._record(request)
        return JSONResponse({"object": "list", "model": "text-embedding-3-small",
                             "data": [{"object": "embedding", "index": 0, "embedding": [0.5, -0.25]}],
                             "usage": {"prompt_tokens": USAGE_IN, "total_tokens": USAGE_IN}})

    async def _messages(self, request: Request) -> Response:
        body = await self._record(request)
        if "fail" in json.dumps(body["messages"]):
            error = {"type": "invalid_request_error", "message": "messages: the conversation is too long"}
            return JSONResponse({"type": "error", "error": error}, status_code=400)
        tools = bool(body.get("tools"))
        call = {"type": "tool_use", "id": "toolu_01", "name": "get_weather", "input": {"city": "Oslo"}}
        usage = {"input_tokens": USAGE_IN, "output_tokens": USAGE_OUT + 5 * tools}
        stop = "tool_use" if tools else "end_turn"
        message = {"id": "msg_01", "type": "message", "role": "assistant", "model": "claude-test",
                   "stop_reason": None, "stop_sequence": None}
        if not body.get("stream"):
            content = [{"type": "text", "text": "".join(WORDS)}, *([call] if tools else [])]
            return JSONResponse({**message, "content": content, "stop_reason": stop, "usage": usage})
        events: list[tuple[str | None, Any]] = [
            ("message_start", {"type": "message_start", "message": {
                **message, "content": [], "usage": {"input_tokens": USAGE_IN, "output_tokens": 1}}}),
            ("ping", {"type": "ping"}),
            ("content_block_start", {"type": "content_block_start", "index": 0,
                                     "content_block": {"type": "text", "text": ""}}),
            *(("content_block_delta", {"type": "content_block_delta", "index": 0,
                                       "delta": {"type": "text_delta", "text": w}}) for w in WORDS),
            ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        ]
        if tools:
            events += [
                ("content_block_start", {"type": "content_block_start", "index": 1,
                                         "content_block": {**call, "input": {}}}),
                ("content_block_delta", {"type": "content_block_delta", "index": 1,
                                         "delta": {"type": "input_json_delta", "partial_json": '{"city": '}}),
                ("content_block_delta", {"type": "content_block_delta", "index": 1,
                                         "delta": {"type": "input_json_delta", "partial_json": '"Oslo"}'}}),
                ("content_block_stop", {"type": "content_block_stop", "index": 1}),
            ]
        events += [("message_delta", {"type": "message_delta", "usage": {"output_tokens": usage["output_tokens"]},
                                      "delta": {"stop_reason": stop, "stop_sequence": None}}),
                   ("message_stop", {"type": "message_stop"})]
        return _sse(events)


def _sse(events: list[tuple[str | None, Any]]) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        for name, data in events:
            text = data if isinstance(data, str) else json.dumps(data)
            yield (f"event: {name}\n" if name else "").encode() + f"data: {text}\n\n".encode()

    return StreamingResponse(body(), media_type="text/event-stream")
