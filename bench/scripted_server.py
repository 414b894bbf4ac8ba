"""A scripted OpenAI-compatible streaming server: fixed TTFT, fixed gap per token, and faults (error
statuses, stalls, mid-stream errors) injected by request number.

It checks the load generator itself: every figure `tidegate bench` reports against it should come out as
scripted. Tests run it in a thread with `serve()`; standalone:

    python -m bench.scripted_server --port 9100 --ttft 0.1 --gap 0.02
"""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


@dataclass
class Script:
    """What the server does; request numbers count from 1 in arrival order."""

    ttft: float = 0.1
    gap: float = 0.02
    fail: dict[int, int] = field(default_factory=dict)  # request number -> HTTP status
    stall: set[int] = field(default_factory=set)  # requests that never send a token
    break_stream: set[int] = field(default_factory=set)  # requests that send an SSE error after 2 tokens
    truncate: set[int] = field(default_factory=set)  # requests whose stream closes after 2 tokens, no [DONE]
    no_usage: bool = False  # leave out the usage chunk, as servers that ignore stream_options do
    count_tokens: Callable[[str], int] = lambda text: len(text.split())
    eos_after: int | None = None  # answers end after this many tokens, as a model's EOS, unless ignore_eos is sent
    bodies: list[dict[str, Any]] = field(default_factory=list)


def build_app(script: Script) -> Starlette:
    async def completions(request: Request) -> Response:
        body = await request.json()
        script.bodies.append(body)
        number = len(script.bodies)
        if number in script.fail:
            status = script.fail[number]
            return JSONResponse({"error": {"message": "scripted", "type": "server_error", "param": None,
                                           "code": status}}, status_code=status)
        chat = request.url.path.endswith("/chat/completions")
        prompt = "".join(m["content"] for m in body["messages"]) if chat else body["prompt"]
        n_out = body.get("max_completion_tokens" if chat else "max_tokens", 16)
        if script.eos_after is not None and not body.get("ignore_eos"):
            n_out = min(n_out, script.eos_after)
        return StreamingResponse(_stream(script, number, chat, script.count_tokens(prompt), n_out),
                                 media_type="text/event-stream")

    return Starlette(routes=[Route("/v1/completions", completions, methods=["POST"]),
                             Route("/v1/chat/completions", completions, methods=["POST"])])


async def _stream(script: Script, number: int, chat: bool, n_in: int, n_out: int) -> AsyncIterator[bytes]:
    def event(payload: dict[str, Any]) -> bytes:
        return f"data: {json.dumps(payload)}\n\n".encode()

    def token(i: int) -> dict[str, Any]:
        choice = {"index": 0, "delta": {"content": f" t{i}"}} if chat else {"index": 0, "text": f" t{i}"}
        return {"id": f"r{number}", "choices": [choice]}

    if chat:  # OpenAI opens a chat stream with an empty role delta, which is not a token
        yield event({"id": f"r{number}", "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
    start = time.perf_counter()
    if number in script.stall:
        await asyncio.sleep(3600)
    for i in range(n_out):
        # sleep to an absolute schedule so timer overshoot does not accumulate across tokens
        due = start + script.ttft + i * script.gap
        await asyncio.sleep(max(0.0, due - time.perf_counter()))
        if number in script.break_stream and i == 2:
            yield b'event: error\ndata: {"error": {"message": "engine died", "type": "server_error"}}\n\n'
            return
        if number in script.truncate and i == 2:
            return
        yield event(token(i))
    if not script.no_usage:
        yield event({"id": f"r{number}", "choices": [],
                     "usage": {"prompt_tokens": n_in, "completion_tokens": n_out, "total_tokens": n_in + n_out}})
    yield b"data: [DONE]\n\n"


@contextmanager
def serve(script: Script) -> Iterator[str]:
    """Run the server on a free loopback port in a thread; yields its base URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(build_app(script), host="127.0.0.1", port=port,
                                           log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            if time.monotonic() > deadline or not thread.is_alive():
                raise RuntimeError("the scripted server did not start")
            time.sleep(0.01)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        server.force_exit = True  # stalled streams would otherwise hold shutdown
        thread.join(timeout=10)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=9100)
    parser.add_argument("--ttft", type=float, default=0.1, help="seconds to the first token")
    parser.add_argument("--gap", type=float, default=0.02, help="seconds between tokens")
    args = parser.parse_args()
    uvicorn.run(build_app(Script(ttft=args.ttft, gap=args.gap)), host=args.host, port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
