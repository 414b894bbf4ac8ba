"""Hostile clients against `tidegate gateway` with two worker processes: connections that never send a request,
or send it a byte at a time, cannot keep a legitimate request out and are cut within the configured limits."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from openai import AsyncOpenAI

from tests.gateway.raw_http import close_quietly, closed_by_server, connect, read_answer
from tests.reliability.processes import GatewayProcess
from tests.reliability.stack import gateway_over_instant_upstream
from tests.servers import RedisServer
from tests.waiting import wait_until_async

HEADER_TIMEOUT = 2.0
MAX_CONNECTIONS = 100  # per worker


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[GatewayProcess, str]]:
    workdir = tmp_path_factory.mktemp("hostile")
    redis = RedisServer(workdir=workdir / "redis").start()
    try:
        with gateway_over_instant_upstream(workdir, chunks=3, redis_url=redis.url, workers=2,
                                           server={"header_timeout": HEADER_TIMEOUT,
                                                   "max_connections": MAX_CONNECTIONS}) as gateway:
            _, secret = gateway.new_key()
            yield gateway, secret
    finally:
        redis.stop()


async def _served(gateway: GatewayProcess, secret: str) -> None:
    """A legitimate chat completion is answered within the client's 10 s timeout."""
    async with AsyncOpenAI(base_url=f"{gateway.url}/v1", api_key=secret, max_retries=0, timeout=10) as client:
        answer = await client.chat.completions.create(model="smollm2", max_tokens=3,
                                                      messages=[{"role": "user", "content": "hi"}])
    assert answer.choices[0].message.content


async def test_a_thousand_idle_connections_cannot_keep_a_request_out(stack: tuple[GatewayProcess, str]) -> None:
    gateway, secret = stack
    writers: list[asyncio.StreamWriter] = []
    closed: list[asyncio.Task[bool]] = []
    try:
        for i in range(1000):  # half silent, half stuck in the middle of their headers
            reader, writer = await connect(gateway.port)
            if i % 2:
                writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\n")
            writers.append(writer)
            closed.append(asyncio.create_task(closed_by_server(reader)))
        await _served(gateway, secret)  # within the client's 10 s timeout, beside 1,000 idle connections
        # the workers made room by closing the longest-idle connections: no more than their caps stay open
        await wait_until_async(lambda: sum(not task.done() for task in closed) <= 2 * MAX_CONNECTIONS,
                               timeout=20, what="idle connections beyond the caps to close")
    finally:
        for writer in writers:
            close_quietly(writer)
        for task in closed:
            task.cancel()
    assert "Traceback" not in gateway.log()


async def test_slow_header_clients_are_all_cut_at_the_header_timeout(stack: tuple[GatewayProcess, str]) -> None:
    gateway, secret = stack
    clients = [await connect(gateway.port) for _ in range(50)]
    for _, writer in clients:
        writer.write(b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\nx-slow: ")

    async def trickle() -> None:
        while True:
            for _, writer in clients:
                if not writer.is_closing():
                    writer.write(b"a")
            await asyncio.sleep(0.2)

    started = time.monotonic()
    sender = asyncio.create_task(trickle())
    try:
        await _served(gateway, secret)  # served (10 s client timeout) while they trickle
        answers = await asyncio.wait_for(asyncio.gather(*(read_answer(reader) for reader, _ in clients)),
                                         HEADER_TIMEOUT + 10)
    finally:
        sender.cancel()
        for _, writer in clients:
            close_quietly(writer)
    assert {answer.status for answer in answers} == {408}
    assert time.monotonic() - started < HEADER_TIMEOUT + 3

