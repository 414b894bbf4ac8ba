"""Faults between the gateway and real backend replicas: a disconnect storm, and a replica SIGKILLed under load.

One module-scoped stack (two SmolLM2 replicas behind a gateway process); the storm runs first, then the kill,
which restarts the replica it killed.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.reliability.processes import GatewayProcess, Process, backend_process, metric_value
from tests.waiting import wait_until, wait_until_async

MAX_CONCURRENCY = 16  # the key's own concurrency quota: a leaked lease would show as a 429 afterwards


@dataclass
class Stack:
    gateway: GatewayProcess
    backends: list[Process]
    secret: str


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[Stack]:
    workdir = tmp_path_factory.mktemp("replicas")
    backends = [backend_process(workdir, model_path, f"backend-{i}", None, "--kv-cache-memory", "96MiB",
                                "--max-num-seqs", "32", "--threads", "1", "--queue-timeout", "150") for i in range(2)]
    gateway: GatewayProcess | None = None
    try:  # whatever started is stopped, also when a later start fails (a failed gateway once orphaned both)
        for backend in backends:  # both load at once: one at a time was 15 s more of the module's setup
            backend.launch()
        for backend in backends:
            backend.wait_healthy(timeout=180)
        gateway = GatewayProcess.create(
            workdir, [f"{b.url}/v1" for b in backends], health_check_interval=0.5,
            # two CPU replicas hold 64 of the storm's 200 requests at once: the rest wait their turn upstream
            timeouts={"connect": 1.0, "first_token": 150.0, "idle": 60.0, "total": 300.0},
            breaker={"consecutive_failures": 2, "cooldown": 2.0, "min_requests": 50},
            retries={"max_attempts": 3, "backoff_base": 0.05},
            priority_classes={"realtime": {"max_concurrency": 256, "queue_size": 512, "queue_timeout": 120.0},
                              "batch": {"max_concurrency": 4, "queue_size": 8, "queue_timeout": 5.0}},
            channel_max_concurrency=256,
        ).start()
        _, secret = gateway.new_key({"max_concurrency": 256})
        yield Stack(gateway, backends, secret)
    finally:
        if gateway is not None:
            gateway.stop()
        for backend in backends:
            backend.stop()


def _chat(max_tokens: int, stream: bool = True) -> dict[str, object]:
    return {"model": "smollm2", "stream": stream, "max_tokens": max_tokens, "ignore_eos": True,
            "messages": [{"role": "user", "content": f"Count to {random.randint(10, 99)}."}]}


async def _stream(client: httpx.AsyncClient, secret: str, max_tokens: int, leave_after: int | None,
                  received: list[int] | None = None) -> str:
    """'ok', 'left' (we hung up on purpose), 'error event', 'cut' (ended without [DONE]) or an HTTP status.

    `received[0]` counts the chunks with choices as they arrive, for a caller watching the stream's progress.
    """
    async with client.stream("POST", "/v1/chat/completions", json=_chat(max_tokens),
                             headers={"authorization": f"Bearer {secret}"}) as response:
        if response.status_code != 200:
            return f"status {response.status_code}"
        contents = 0
        async for line in response.aiter_lines():
            if line.startswith("event: error"):
                return "error event"
            if line == "data: [DONE]":
                return "ok"
            if line.startswith("data: ") and json.loads(line[6:]).get("choices"):
                contents += 1
                if received is not None:
                    received[0] = contents
                if leave_after is not None and contents >= leave_after:
                    return "left"  # leaving the block closes the connection mid-stream
        return "cut"


def _idle(url: str) -> bool:
    text = httpx.get(f"{url}/metrics", timeout=10).text
    return (metric_value(text, "tidegate_backend_num_requests_running") == 0
            and metric_value(text, "tidegate_backend_num_requests_waiting") == 0
            and metric_value(text, "tidegate_backend_kv_cache_blocks_free")
            == metric_value(text, "tidegate_backend_kv_cache_blocks_total"))


def _gateway_idle(gateway: GatewayProcess) -> bool:
    text = gateway.metrics()
    return (metric_value(text, "tidegate_priority_active") == 0 and metric_value(text, "tidegate_priority_queued") == 0
            and metric_value(text, "tidegate_channel_in_flight") == 0)


async def _no_lease_left(stack: Stack) -> None:
    """A key with max_concurrency N admits N at once only if every earlier lease was released."""
    key_id, secret = stack.gateway.new_key({"max_concurrency": MAX_CONCURRENCY})
    async with httpx.AsyncClient(base_url=stack.gateway.url, timeout=120) as client:
        outcomes = await asyncio.gather(*(_stream(client, secret, 2, None) for _ in range(MAX_CONCURRENCY)))
    assert Counter(outcomes) == Counter({"ok": MAX_CONCURRENCY})
    del key_id


async def test_disconnect_storm_leaves_no_lease_reservation_or_kv_block(stack: Stack) -> None:
    rng = random.Random(7)
    limits = httpx.Limits(max_connections=250)
    async with httpx.AsyncClient(base_url=stack.gateway.url, timeout=180, limits=limits) as client:
        outcomes = Counter(await asyncio.gather(*(
            _stream(client, stack.secret, 64, leave_after=rng.randint(1, 6)) for _ in range(200))))
    assert outcomes["left"] >= 190, outcomes  # a few may finish early if their budget allows, none may fail
    assert set(outcomes) <= {"left", "ok"}, outcomes
    for backend in stack.backends:
        wait_until(lambda b=backend: _idle(b.url), 60, f"{backend.url} idle", interval=0.2)
    wait_until(lambda: _gateway_idle(stack.gateway), 30, "the gateway idle", interval=0.2)
    await _no_lease_left(stack)


def _channel(gateway: GatewayProcess, name: str) -> dict[str, object]:
    with gateway.admin() as admin:
        rows = admin.get("/admin/channels").json()["data"]
    return next(row for row in rows if row["name"] == name)


def _out_of_rotation(stack: Stack, name: str) -> bool:
    """The gateway stopped sending to the channel: its breaker opened or its health check failed."""
    status = _channel(stack.gateway, name)
    return status["models"]["smollm2"]["breaker"] == "open" or not status["healthy"]  # type: ignore[index]


def _running(url: str) -> bool:
    return metric_value(httpx.get(f"{url}/metrics", timeout=10).text, "tidegate_backend_num_requests_running") > 0


async def test_replica_killed_under_load_fails_over_and_recovers(stack: Stack) -> None:
    victim = stack.backends[0]
    results: list[tuple[float, float, str]] = []  # (sent, ended, outcome)
    received: dict[int, list[int]] = {}  # per user: chunks its current stream has received

    async def user(n: int, client: httpx.AsyncClient, stop: asyncio.Event) -> None:
        while not stop.is_set():
            sent = time.monotonic()
            received[n] = [0]
            outcome = await _stream(client, stack.secret, 24, None, received[n])
            results.append((sent, time.monotonic(), outcome))

    def victim_streaming() -> bool:
        # No await between the two reads: every request the victim runs belongs to a stream the client still
        # counts, so if each has passed its first bytes, the kill cuts a stream failover can no longer save.
        return (len(received) == 8 and all(chunks[0] >= 2 for chunks in received.values())
                and _running(victim.url))

    stop = asyncio.Event()
    async with httpx.AsyncClient(base_url=stack.gateway.url, timeout=120) as client:
        users = [asyncio.create_task(user(n, client, stop)) for n in range(8)]
        await wait_until_async(lambda: len(results) >= 8, 90, "eight streams served before the kill", interval=0.2)
        await wait_until_async(victim_streaming, 60, "every stream past its first bytes, some on the victim",
                               interval=0.05)
        killed_at = time.monotonic()
        victim.kill()
        await wait_until_async(
            lambda: sum(sent >= killed_at for sent, _, _ in results) >= 8 and _out_of_rotation(stack, "c0"),
            120, "eight streams sent after the kill answered, and c0 out of rotation", interval=0.2)
        stop.set()
        await asyncio.gather(*users)

    done_before = Counter(outcome for _, ended, outcome in results if ended < killed_at)
    spanning = Counter(outcome for sent, ended, outcome in results if sent < killed_at <= ended)
    sent_after = Counter(outcome for sent, _, outcome in results if sent >= killed_at)
    assert done_before and set(done_before) == {"ok"}, done_before
    # streams the kill cut end with an SSE error event, never silently and never as a clean end
    assert set(spanning) <= {"ok", "error event"} and spanning["error event"] >= 1, spanning
    # every request sent after the kill, including those routed to the dead replica, succeeded
    assert sent_after["ok"] >= 8 and set(sent_after) == {"ok"}, sent_after

    victim.start(health_timeout=180)  # the replica comes back on its port
    async with httpx.AsyncClient(base_url=stack.gateway.url, timeout=120) as client:

        async def back_in_rotation() -> bool:
            status = _channel(stack.gateway, "c0")
            if status["healthy"] and status["models"]["smollm2"]["breaker"] == "closed":  # type: ignore[index]
                return True
            assert await _stream(client, stack.secret, 4, None) == "ok"  # live traffic probes the half-open breaker
            return False

        await wait_until_async(back_in_rotation, 60, "c0 healthy with its breaker closed", interval=0.2)
    wait_until(lambda: all(_idle(b.url) for b in stack.backends), 60, "both backends idle", interval=0.2)
    wait_until(lambda: _gateway_idle(stack.gateway), 30, "the gateway idle", interval=0.2)
    await _no_lease_left(stack)
