"""Load through one gateway process to an instant upstream: 500 concurrent streams, then a soak for leaks."""

from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.reliability.processes import GatewayProcess
from tests.reliability.stack import gateway_over_instant_upstream

CHUNKS = 20
SOAK_SECONDS = 40.0
SOAK_RATE = 40.0  # requests per second, half of them streamed


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    pools = {"realtime": {"max_concurrency": 600, "queue_size": 1000, "queue_timeout": 30.0},
             "batch": {"max_concurrency": 16, "queue_size": 16, "queue_timeout": 1.0}}
    with gateway_over_instant_upstream(tmp_path, CHUNKS, priority_classes=pools, log_level="warning",
                                       health_check_interval=5.0, channel_max_concurrency=600) as process:
        yield process


async def _outcome(call: object) -> str:
    try:
        return await call  # type: ignore[misc,no-any-return]
    except httpx.HTTPError as exc:
        return type(exc).__name__


async def _stream(client: httpx.AsyncClient, secret: str) -> str:
    body = {"model": "smollm2", "stream": True, "max_tokens": CHUNKS,
            "messages": [{"role": "user", "content": "hello"}]}
    async with client.stream("POST", "/v1/chat/completions", json=body,
                             headers={"authorization": f"Bearer {secret}"}) as response:
        if response.status_code != 200:
            return f"status {response.status_code}"
        contents, done = 0, False
        async for line in response.aiter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: ") and json.loads(line[6:]).get("choices"):
                contents += bool(json.loads(line[6:])["choices"][0].get("delta", {}).get("content"))
            elif line.startswith("event: error"):
                return "error event"
        return "ok" if done and contents == CHUNKS else f"incomplete ({contents} chunks, done={done})"


async def _plain(client: httpx.AsyncClient, secret: str) -> str:
    response = await client.post("/v1/chat/completions", headers={"authorization": f"Bearer {secret}"},
                                 json={"model": "smollm2", "messages": [{"role": "user", "content": "hello"}]})
    return "ok" if response.status_code == 200 else f"status {response.status_code}"


async def test_500_concurrent_streams_finish_without_error(gateway: GatewayProcess) -> None:
    _, secret = gateway.new_key()
    limits = httpx.Limits(max_connections=600, max_keepalive_connections=600)
    async with httpx.AsyncClient(base_url=gateway.url, timeout=60, limits=limits) as client:
        outcomes = Counter(await asyncio.gather(*(_outcome(_stream(client, secret)) for _ in range(500))))
    assert outcomes == Counter({"ok": 500})


async def test_soak_at_a_fixed_rate_does_not_grow_memory(gateway: GatewayProcess) -> None:
    _, secret = gateway.new_key()
    async with httpx.AsyncClient(base_url=gateway.url, timeout=30,
                                 limits=httpx.Limits(max_connections=200)) as client:

        async def run_for(seconds: float) -> Counter[str]:
            tasks = []
            start = time.monotonic()
            i = 0
            while (elapsed := time.monotonic() - start) < seconds:
                due = start + i / SOAK_RATE
                await asyncio.sleep(max(0.0, due - time.monotonic()))
                call = _stream if i % 2 else _plain
                tasks.append(asyncio.create_task(_outcome(call(client, secret))))
                i += 1
                del elapsed
            return Counter(await asyncio.gather(*tasks))

        warm = await run_for(5.0)
        before = gateway.rss_bytes()
        soaked = await run_for(SOAK_SECONDS)
        after = gateway.rss_bytes()
    assert set(warm) == {"ok"} and set(soaked) == {"ok"}, (warm, soaked)
    assert soaked["ok"] >= 0.9 * SOAK_RATE * SOAK_SECONDS  # the load was really applied
    growth = after - before
    print(f"gateway RSS {before / 2**20:.1f} MiB -> {after / 2**20:.1f} MiB over {sum(soaked.values())} requests")
    assert growth < 16 * 2**20, f"RSS grew by {growth / 2**20:.1f} MiB"
