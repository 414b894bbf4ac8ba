"""The backend under more load than it admits: fast 503s with Retry-After, queue timeouts, queued disconnects."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import openai
import pytest

from tests.backend.backend_process import BackendProcess

SLOTS, QUEUE = 2, 3
LONG = {"ignore_eos": True}


@pytest.fixture(scope="module")
def backend_server(launch_backend: Callable[..., BackendProcess]) -> BackendProcess:
    """Two running slots, three waiting places, a 3 s queue timeout."""
    return launch_backend("--max-num-seqs", str(SLOTS), "--max-waiting", str(QUEUE), "--queue-timeout",
                          "3").wait_ready()


@pytest.fixture
def aclient(backend_server: BackendProcess) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=backend_server.base_url, api_key="unused", max_retries=0, timeout=60)


@contextlib.asynccontextmanager
async def slots_taken(aclient: openai.AsyncOpenAI, server: BackendProcess) -> AsyncIterator[None]:
    """Both running slots busy with long streams (cancelled on exit, which also tests their abort)."""
    async def hog(i: int) -> None:
        stream = await aclient.completions.create(model="smollm2", prompt=f"Story {i}:", max_tokens=2000,
                                                  temperature=0, stream=True, extra_body=LONG)
        async for _ in stream:
            pass

    hogs = [asyncio.create_task(hog(i)) for i in range(SLOTS)]
    await wait_metric(server, "tidegate_backend_num_requests_running", SLOTS)
    try:
        yield
    finally:
        for task in hogs:
            task.cancel()
        await asyncio.gather(*hogs, return_exceptions=True)


async def wait_metric(server: BackendProcess, name: str, value: float, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while (now := (await asyncio.to_thread(server.metrics))[name]) != value:
        assert time.monotonic() < deadline, f"{name} stayed {now}, expected {value}"
        await asyncio.sleep(0.05)


async def test_flood_beyond_the_queue_gets_fast_503s_with_retry_after(backend_server: BackendProcess,
                                                                      aclient: openai.AsyncOpenAI) -> None:
    outcomes: list[tuple[str, float, Any]] = []
    start = time.monotonic()

    async def one(i: int) -> None:
        try:
            await aclient.completions.create(model="smollm2", prompt=f"Request {i}", max_tokens=12,
                                             temperature=0, extra_body=LONG)
            outcomes.append(("ok", time.monotonic() - start, None))
        except openai.InternalServerError as exc:
            outcomes.append(("503", time.monotonic() - start, exc))

    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(24))), 90)  # none may hang

    ok = [t for kind, t, _ in outcomes if kind == "ok"]
    refused = [(t, exc) for kind, t, exc in outcomes if kind == "503"]
    assert len(ok) >= SLOTS and len(ok) + len(refused) == 24
    assert len(refused) >= 24 - SLOTS - QUEUE
    for _, exc in refused:
        assert exc.status_code == 503
        assert int(exc.response.headers["retry-after"]) >= 1
        assert exc.body["code"] in {"overloaded", "queue_timeout"}
    overloaded = [t for t, exc in refused if exc.body["code"] == "overloaded"]
    assert len(overloaded) >= 24 - SLOTS - QUEUE
    assert max(overloaded) < min(ok)  # refused at once, not after the admitted work
    assert httpx.get(backend_server.url + "/health").status_code == 200
    after = await aclient.completions.create(model="smollm2", prompt="Still there?", max_tokens=2)
    assert after.usage is not None and after.usage.completion_tokens >= 1
    metrics = backend_server.metrics()
    assert metrics['tidegate_backend_request_rejected_total{"reason": "overloaded"}'] >= len(overloaded)


async def test_a_request_that_cannot_start_in_time_gets_503_queue_timeout(backend_server: BackendProcess,
                                                                          aclient: openai.AsyncOpenAI) -> None:
    async with slots_taken(aclient, backend_server):
        with pytest.raises(openai.InternalServerError) as caught:
            await aclient.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "hi"}],
                                                  max_tokens=2, stream=True)
    err = caught.value
    assert err.status_code == 503 and isinstance(err.body, dict) and err.body["code"] == "queue_timeout"
    assert int(err.response.headers["retry-after"]) >= 1


async def test_a_client_that_leaves_while_queued_is_removed_from_the_queue(backend_server: BackendProcess,
                                                                           aclient: openai.AsyncOpenAI) -> None:
    async with slots_taken(aclient, backend_server), httpx.AsyncClient(base_url=backend_server.base_url) as http:
        body = {"model": "smollm2", "prompt": "Waiting", "max_tokens": 4, "stream": True}
        waiting = asyncio.create_task(http.post("/completions", json=body, headers={"x-request-id": "queued-1"}))
        await wait_metric(backend_server, "tidegate_backend_num_requests_waiting", 1)
        waiting.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiting
        await wait_metric(backend_server, "tidegate_backend_num_requests_waiting", 0, timeout=2.0)
        assert backend_server.metrics()["tidegate_backend_num_requests_running"] == SLOTS
    lines = [line for line in backend_server.request_lines() if line["request_id"] == "queued-1"]
    assert [(line["status"], line["finish_reason"]) for line in lines] == [(499, "abort")]
