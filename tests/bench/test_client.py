"""The load generator against a server that drops kept-alive connections, as llama.cpp's server does."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from bench.client import StreamingClient, Target
from bench.loadgen import LoadGenerator, LoadProfile
from bench.records import MeasuredRequest
from bench.tokenizer import PromptTokenizer
from bench.workloads import Workload, WorkloadSpec

CHUNKS = 3


def _stream_body() -> bytes:
    events = [{"choices": [{"index": 0, "text": f"t{i}"}]} for i in range(CHUNKS)]
    events.append({"choices": [], "usage": {"prompt_tokens": 4, "completion_tokens": CHUNKS}})
    return b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"


@asynccontextmanager
async def dropping_server(per_connection: int) -> AsyncIterator[dict[str, int]]:
    """Answers `per_connection` requests on a connection without saying it will close, then closes it as the
    next request arrives, without a byte of answer: the client learns of it only when it reuses the socket."""
    seen = {"connections": 0, "answered": 0, "dropped": 0}
    body = _stream_body()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen["connections"] += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                               if line.lower().startswith(b"content-length:")), 0)
                await reader.readexactly(length)
                if served == per_connection:
                    seen["dropped"] += 1
                    return
                served += 1
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                             b"content-length: %d\r\n\r\n" % len(body) + body)
                await writer.drain()
                seen["answered"] += 1
        except (asyncio.IncompleteReadError, asyncio.CancelledError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    seen["port"] = server.sockets[0].getsockname()[1]
    async with server:
        yield seen


async def test_a_request_on_a_connection_the_server_closed_is_retried_once_on_a_fresh_one(
        tokenizer: PromptTokenizer) -> None:
    async with dropping_server(per_connection=2) as seen:
        target = Target(base_url=f"http://127.0.0.1:{seen['port']}", model="m", timeout=20)
        profile = LoadProfile(concurrency=1, num_requests=8)
        result = await LoadGenerator(target, Workload(WorkloadSpec(input_len=8, output_len=CHUNKS), tokenizer), profile).run()
    summary = result.summary()
    assert summary["completed"] == 8 and summary["failed"] == 0
    assert summary["retried_on_fresh_connection"] == seen["dropped"] >= 2
    assert seen["answered"] == 8


async def test_a_failure_on_a_fresh_connection_is_not_retried() -> None:
    async with dropping_server(per_connection=0) as seen:
        target = Target(base_url=f"http://127.0.0.1:{seen['port']}", model="m", timeout=20)
        client = StreamingClient(target)
        record = MeasuredRequest(index=0, scheduled=0.0)
        try:
            await client.send({"model": "m", "prompt": "x", "stream": True}, record, 0.0)
        finally:
            await client.aclose()
    assert record.error == "transport_error" and not record.retried
    assert seen["dropped"] == 1
