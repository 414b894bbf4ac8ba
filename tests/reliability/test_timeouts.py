"""Each timeout layer fires at its configured time, measured through a real gateway process."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.upstreams import MockUpstream
from tests.reliability.processes import GatewayProcess
from tests.waiting import wait_until_async

SLACK = 0.6  # process scheduling on a loaded 2-core machine


@pytest.fixture
def blackhole() -> Iterator[str]:
    """A port whose accept queue is full: SYNs are dropped, so a connect hangs until its deadline."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    for _ in range(4):
        filler = socket.socket()
        filler.setblocking(False)
        with contextlib.suppress(BlockingIOError):
            filler.connect(("127.0.0.1", port))
        fillers.append(filler)
    time.sleep(0.2)
    yield f"http://127.0.0.1:{port}/v1"
    for filler in fillers:
        filler.close()
    listener.close()


@pytest.fixture
async def stalling() -> AsyncIterator[MockUpstream]:
    upstream = await MockUpstream(chunk_delay=0.05).start()
    yield upstream
    await upstream.stop()


def _gateway(tmp_path: Path, urls: list[str], **timeouts: float) -> GatewayProcess:
    layers = {"connect": 5.0, "first_token": 5.0, "idle": 5.0, "total": 10.0, **timeouts}
    return GatewayProcess.create(tmp_path, urls, timeouts=layers, retries={"max_attempts": 1},
                                 priority_classes={"realtime": {"max_concurrency": 1, "queue_size": 4,
                                                                "queue_timeout": 0.8}})


async def _timed_post(url: str, secret: str, body: dict[str, object]) -> tuple[float, int, str]:
    start = time.monotonic()
    async with httpx.AsyncClient(timeout=30) as client, client.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers={"authorization": f"Bearer {secret}"}
    ) as response:
        text = (await response.aread()).decode()
    return time.monotonic() - start, response.status_code, text


def _chat(stream: bool, max_tokens: int = 20) -> dict[str, object]:
    return {"model": "smollm2", "messages": [{"role": "user", "content": "hi"}], "stream": stream,
            "max_tokens": max_tokens}


async def test_connect_timeout_fires_at_its_deadline(tmp_path: Path, blackhole: str) -> None:
    gateway = _gateway(tmp_path, [blackhole], connect=0.7).start()
    try:
        _, secret = gateway.new_key()
        elapsed, status, text = await _timed_post(gateway.url, secret, _chat(False))
        assert status == 504, text
        assert json.loads(text)["error"]["type"]
        assert 0.7 <= elapsed < 0.7 + SLACK
    finally:
        gateway.stop()


async def test_first_token_timeout_fires_before_any_byte(tmp_path: Path, stalling: MockUpstream) -> None:
    stalling.stall_at = 0  # headers and the role chunk arrive, the first content token never does
    gateway = _gateway(tmp_path, [stalling.base_url], first_token=0.8).start()
    try:
        _, secret = gateway.new_key()
        elapsed, status, text = await _timed_post(gateway.url, secret, _chat(True))
        assert status == 504, text
        assert json.loads(text)["error"]["code"] == "upstream_timeout"
        assert 0.8 <= elapsed < 0.8 + SLACK
    finally:
        gateway.stop()


async def test_idle_timeout_ends_the_stream_with_an_error_event(tmp_path: Path, stalling: MockUpstream) -> None:
    stalling.stall_at = 3  # three tokens, then silence
    gateway = _gateway(tmp_path, [stalling.base_url], idle=0.7).start()
    try:
        _, secret = gateway.new_key()
        elapsed, status, text = await _timed_post(gateway.url, secret, _chat(True))
        assert status == 200  # the stream had started: the error travels in the stream
        assert "event: error" in text and "[DONE]" not in text
        assert text.count('"content": "t') == 3
        assert 0.15 + 0.7 <= elapsed < 0.15 + 0.7 + SLACK
    finally:
        gateway.stop()


async def test_total_timeout_bounds_a_trickling_stream(tmp_path: Path, stalling: MockUpstream) -> None:
    stalling.chunk_delay = 0.2  # every gap is inside the idle deadline; the whole is not
    gateway = _gateway(tmp_path, [stalling.base_url], idle=1.0, total=1.5, first_token=1.0, connect=1.0).start()
    try:
        _, secret = gateway.new_key()
        elapsed, status, text = await _timed_post(gateway.url, secret, _chat(True, max_tokens=50))
        assert status == 200 and "event: error" in text and "[DONE]" not in text
        assert 1.5 <= elapsed < 1.5 + SLACK
    finally:
        gateway.stop()


async def test_queue_timeout_answers_503_with_retry_after(tmp_path: Path, stalling: MockUpstream) -> None:
    stalling.chunk_delay = 0.1  # the first request holds the only slot for about 3 s
    gateway = _gateway(tmp_path, [stalling.base_url]).start()
    try:
        _, secret = gateway.new_key()
        holder = asyncio.create_task(_timed_post(gateway.url, secret, _chat(True, max_tokens=30)))
        await wait_until_async(lambda: stalling.attempts == 1, what="the first request upstream, holding the slot")
        start = time.monotonic()
        async with httpx.AsyncClient(timeout=30) as client:
            response = await client.post(f"{gateway.url}/v1/chat/completions", json=_chat(False),
                                         headers={"authorization": f"Bearer {secret}"})
        elapsed = time.monotonic() - start
        assert response.status_code == 503, response.text
        assert float(response.headers["retry-after"]) > 0
        assert 0.8 <= elapsed < 0.8 + SLACK
        _, status, _ = await holder
        assert status == 200
    finally:
        gateway.stop()
