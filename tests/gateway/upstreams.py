"""Scripted OpenAI-compatible upstreams on loopback, each able to produce one fault on demand."""

from __future__ import annotations

import asyncio
import gzip
import json
import time
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from tests.servers import free_port
from tests.waiting import wait_until_async

# what an upstream must never pass to clients: its own API key and an internal URL
LEAKED = "key sk-live-9f8e7d6c5b4a39281706 at http://10.0.3.7:8000/internal/v1"


class Fault(StrEnum):
    none = "none"
    error_500 = "error_500"
    rate_limited = "rate_limited"  # 429 with Retry-After
    overloaded = "overloaded"  # 503 with Retry-After, as a backend whose queue is full answers
    hang = "hang"  # accepts the request, never answers
    cut = "cut"  # streams half the chunks, then drops the connection
    bad_request = "bad_request"  # a 400 of the upstream's own
    gzip = "gzip"  # compresses every answer, whatever the request's Accept-Encoding says
    no_usage = "no_usage"  # answers without `usage`
    html_400 = "html_400"  # a 400 from a proxy in front of the model: HTML with an API key and an internal URL
    leaky_400 = "leaky_400"  # an OpenAI-shaped 400 whose message carries an API key and an internal URL
    never_streams = "never_streams"  # answers a whole body even when asked for a stream
    holds_tools = "holds_tools"  # a forced tool call answers 200, then holds every token back (issue 41)


@dataclass
class MockUpstream:
    """An upstream served by uvicorn inside the test's event loop; `attempts` counts completion calls."""

    fault: Fault = Fault.none
    chunk_delay: float = 0.0
    stall_at: int = -1  # the chunk before which a stream stalls for good (-1: never)
    padding: int = 0  # characters added to each streamed token, for answers that fill socket buffers fast
    healthy: bool = True  # what /health answers
    sets_cookie: str = ""  # a Set-Cookie every answer carries, as a sticky load balancer in front would send
    host: str = "127.0.0.1"  # the name channels use for it ("localhost": a client keeps cookies of names, not of IPs)
    health_checks: int = 0
    port: int = field(default_factory=free_port)
    attempts: int = 0
    completed: int = 0
    abandoned: int = 0  # streams whose client went away before they ended
    prompt_served: int = 0  # token counters its /metrics shows
    generated: int = 0
    seen_bodies: list[dict[str, Any]] = field(default_factory=list)
    seen_headers: list[dict[str, str]] = field(default_factory=list)
    _server: uvicorn.Server | None = None
    _task: asyncio.Task[None] | None = None

    @property
    def base_url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    async def start(self) -> MockUpstream:
        app = Starlette(routes=[
            Route("/v1/chat/completions", self._complete, methods=["POST"]),
            Route("/v1/completions", self._complete, methods=["POST"]),
            Route("/v1/embeddings", self._embed, methods=["POST"]),
            Route("/health", self._health),
            Route("/metrics", self._metrics),
        ])
        self._server, self._task = await serve_in_loop(app if not self.sets_cookie else self._with_cookie(app),
                                                       self.port)
        return self

    def _with_cookie(self, app: Starlette) -> Any:
        async def asgi(scope: Any, receive: Any, send: Any) -> None:
            async def send_with_cookie(message: Any) -> None:
                if message["type"] == "http.response.start":
                    message["headers"] = [*message["headers"], (b"set-cookie", self.sets_cookie.encode())]
                await send(message)
            await app(scope, receive, send_with_cookie)
        return asgi

    async def stop(self) -> None:
        await stop_in_loop(self._server, self._task)

    async def _health(self, request: Request) -> Response:
        self.health_checks += 1
        return JSONResponse({"status": "ok" if self.healthy else "down"}, status_code=200 if self.healthy else 503)

    async def _metrics(self, request: Request) -> Response:
        """The backend's token counters, counting what this upstream answered."""
        return Response(f'tidegate_backend_prompt_tokens_total{{model_name="m"}} {self.prompt_served}\n'
                        f'tidegate_backend_generation_tokens_total{{model_name="m"}} {self.generated}\n',
                        media_type="text/plain")

    async def _embed(self, request: Request) -> Response:
        """Embeddings of 3 dimensions; its usage counts one token per character, unlike the gateway's estimate."""
        self.attempts += 1
        body = await request.json()
        self.seen_bodies.append(body)
        inputs = body["input"] if isinstance(body["input"], list) else [body["input"]]
        data = [{"object": "embedding", "index": i, "embedding": [0.5, -0.25, float(i)]} for i in range(len(inputs))]
        tokens = sum(len(str(text)) for text in inputs)
        self.completed += 1
        return JSONResponse({"object": "list", "data": data, "model": body["model"],
                             "usage": {"prompt_tokens": tokens, "total_tokens": tokens}})

    async def _complete(self, request: Request) -> Response:
        self.attempts += 1
        body = await request.json()
        self.seen_bodies.append(body)
        self.seen_headers.append(dict(request.headers))
        if self.fault is Fault.error_500:
            return JSONResponse({"error": {"message": "boom", "type": "server_error"}}, status_code=500)
        if self.fault is Fault.rate_limited:
            return JSONResponse({"error": {"message": "busy", "type": "rate_limit"}}, status_code=429,
                                headers={"retry-after": "0.2"})
        if self.fault is Fault.bad_request:
            error = {"message": "no", "type": "invalid_request_error", "param": None, "code": "upstream_says_no"}
            return JSONResponse({"error": error}, status_code=400)
        if self.fault is Fault.html_400:
            return Response(f"<html><body><h1>400 Bad Request</h1>{LEAKED}</body></html>", status_code=400,
                            media_type="text/html")
        if self.fault is Fault.leaky_400:
            error = {"message": f"rejected: {LEAKED}", "type": "invalid_request_error", "param": "messages",
                     "code": "context_length_exceeded"}
            return JSONResponse({"error": error}, status_code=400)
        if self.fault is Fault.overloaded:
            return JSONResponse({"error": {"message": "queue full", "type": "service_unavailable"}},
                                status_code=503, headers={"retry-after": "0.2"})
        if self.fault is Fault.hang:
            await asyncio.sleep(3600)
        if self.fault is Fault.holds_tools and body.get("tool_choice") == "required":
            return StreamingResponse(_held(body["model"]), media_type="text/event-stream")
        chat = request.url.path.endswith("/chat/completions")
        n = int(body.get("max_tokens") or 5)
        prompt_tokens = len(json.dumps(body.get("messages") or body.get("prompt"))) // 4
        self.prompt_served, self.generated = self.prompt_served + prompt_tokens, self.generated + n
        if body.get("stream") and self.fault is not Fault.never_streams:
            include_usage = bool((body.get("stream_options") or {}).get("include_usage"))
            include_usage = include_usage and self.fault is not Fault.no_usage
            chunks = self._chunks(body["model"], chat, n, prompt_tokens, include_usage)
            if self.fault is Fault.gzip:
                return StreamingResponse(_gzipped(chunks), media_type="text/event-stream",
                                         headers={"content-encoding": "gzip"})
            return StreamingResponse(chunks, media_type="text/event-stream")
        await asyncio.sleep(self.chunk_delay * n)  # as long as streaming the same tokens would take
        self.completed += 1
        text = "".join(f"t{i} " for i in range(n))
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "length"}
            if chat else {"index": 0, "text": text, "finish_reason": "length"}
        )
        answer: dict[str, Any] = {
            "id": "cmpl-1", "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": body["model"], "choices": [choice],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n, "total_tokens": prompt_tokens + n},
        }
        if self.fault is Fault.no_usage:
            del answer["usage"]
        if self.fault is Fault.gzip:
            return Response(gzip.compress(json.dumps(answer).encode()), media_type="application/json",
                            headers={"content-encoding": "gzip"})
        return JSONResponse(answer)

    async def _chunks(self, model: str, chat: bool, n: int, prompt_tokens: int,
                      include_usage: bool) -> AsyncIterator[bytes]:
        try:
            async for event in self._events(model, chat, n, prompt_tokens, include_usage):
                yield event
        except (asyncio.CancelledError, GeneratorExit):
            self.abandoned += 1
            raise

    async def _events(self, model: str, chat: bool, n: int, prompt_tokens: int,
                      include_usage: bool) -> AsyncIterator[bytes]:
        base = {"id": "cmpl-1", "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()), "model": model}
        if chat:
            yield _event({**base, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                               "finish_reason": None}]})
        for i in range(n):
            if self.fault is Fault.cut and i == n // 2:
                raise ConnectionError("cut on purpose")  # uvicorn drops the connection mid-body
            if i == self.stall_at:
                await asyncio.sleep(3600)
            if self.chunk_delay:
                await asyncio.sleep(self.chunk_delay)
            last = i == n - 1
            choice: dict[str, Any] = {"index": 0, "finish_reason": "length" if last else None}
            token = f"t{i} " + "x" * self.padding
            if chat:
                choice["delta"] = {"content": token}
            else:
                choice["text"] = token
            yield _event({**base, "choices": [choice]})
        if include_usage:
            yield _event({**base, "choices": [],
                          "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": n,
                                    "total_tokens": prompt_tokens + n}})
        self.completed += 1
        yield b"data: [DONE]\n\n"


async def _held(model: str) -> AsyncIterator[bytes]:
    """The role chunk at once, then nothing: a stream whose first token never comes."""
    yield _event({"id": "cmpl-1", "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
                  "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}]})
    await asyncio.sleep(3600)


async def serve_in_loop(app: Starlette, port: int) -> tuple[uvicorn.Server, asyncio.Task[None]]:
    """A loopback server for `app` inside the test's event loop, once it accepts connections."""
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=0.2,
                            lifespan="off")
    server = uvicorn.Server(config)
    task = asyncio.create_task(server.serve())
    await wait_until_async(lambda: server.started, timeout=30, what="the loopback server accepting connections",
                           interval=0.01)
    return server, task


async def stop_in_loop(server: uvicorn.Server | None, task: asyncio.Task[None] | None) -> None:
    if server is not None and task is not None:
        server.should_exit = True
        server.force_exit = True
        await asyncio.wait_for(task, 5)


async def _gzipped(chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    """A gzip stream flushed after every event, as a compressing proxy sends SSE."""
    packer = zlib.compressobj(wbits=31)
    async for chunk in chunks:
        yield packer.compress(chunk) + packer.flush(zlib.Z_SYNC_FLUSH)
    yield packer.flush()


def _event(obj: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(obj).encode() + b"\n\n"
