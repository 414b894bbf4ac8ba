"""Redis stopped and restarted under load: each limit class follows its policy, no 500, no usage lost."""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from tests.gateway.upstreams import MockUpstream
from tests.reliability.processes import GatewayProcess, metric_value
from tests.servers import RedisServer
from tests.waiting import wait_until_async


@pytest.fixture
async def upstream() -> AsyncIterator[MockUpstream]:
    server = await MockUpstream().start()
    yield server
    await server.stop()


Row = tuple[float, float, int, bool]  # (sent, answered, status, marked degraded)


async def _load(client: httpx.AsyncClient, secret: str, results: list[Row], stop: asyncio.Event,
                every: float) -> None:
    while not stop.is_set():
        sent = time.monotonic()
        response = await client.post("/v1/chat/completions", headers={"authorization": f"Bearer {secret}"},
                                     json={"model": "smollm2", "max_tokens": 3,
                                           "messages": [{"role": "user", "content": "hi"}]})
        results.append((sent, time.monotonic(), response.status_code, "x-tidegate-degraded" in response.headers))
        if response.status_code >= 400:
            assert "error" in response.json()
        await asyncio.sleep(every)


def _recovered(rows: list[Row], since: float) -> bool:
    """The last ten answers to requests sent after `since` were served from Redis again."""
    last = [row for row in rows if row[0] > since][-10:]
    return len(last) == 10 and all(status == 200 and not degraded for _, _, status, degraded in last)


async def test_redis_outage_follows_each_policy_and_loses_no_usage(tmp_path: Path,
                                                                   upstream: MockUpstream) -> None:
    redis = RedisServer(workdir=tmp_path / "redis", persistent=True).start()
    gateway = GatewayProcess.create(
        tmp_path, [upstream.base_url], redis_url=redis.url, gateway_replicas=2,
        redis_down={"auth": "local", "budgets": "fail_closed", "rate_limits": "local"},
    ).start()
    try:
        rate_id, rate_secret = gateway.new_key({"rpm": 1000})
        budget_id, budget_secret = gateway.new_key({"tokens_per_day": 1_000_000})
        results: dict[str, list[Row]] = {"rate": [], "budget": []}
        stop = asyncio.Event()
        async with httpx.AsyncClient(base_url=gateway.url, timeout=20) as client:
            workers = [asyncio.create_task(_load(client, rate_secret, results["rate"], stop, 0.05)),
                       asyncio.create_task(_load(client, budget_secret, results["budget"], stop, 0.05))]
            await wait_until_async(lambda: all(_recovered(rows, 0.0) for rows in results.values()),
                                   what="ten requests per key served before the outage")
            redis.stop()
            await wait_until_async(lambda: metric_value(gateway.metrics(), "tidegate_store_degraded") == 1.0,
                                   what="the gateway's store marked degraded")
            down_at = time.monotonic()  # every request sent from here on meets the outage
            await wait_until_async(
                lambda: all(sum(row[0] > down_at for row in rows) >= 10 for rows in results.values()),
                what="ten requests per key answered during the outage")
            with gateway.admin() as admin:  # the admin API cannot read or write its records: 503, never 500
                for method, path, body in (("GET", "/admin/accounts", None), ("POST", "/admin/accounts",
                                                                             {"name": "during the outage"})):
                    answer = admin.request(method, path, json=body)
                    assert answer.status_code == 503, (method, path, answer.text)
                    assert answer.json()["error"]["code"] == "store_unavailable"
                    assert answer.headers["retry-after"] == "1"
            up_at = time.monotonic()
            redis.start()
            # recovery takes a retry interval plus Redis's start and the replay of what was settled meanwhile
            await wait_until_async(lambda: all(_recovered(rows, up_at) for rows in results.values()), timeout=60,
                                   what="ten requests per key served from Redis again")
            stop.set()
            await asyncio.gather(*workers)

        for name, rows in results.items():
            statuses = collections.Counter(status for _, _, status, _ in rows)
            assert 500 not in statuses and 502 not in statuses, (name, statuses)
            outage = [row for row in rows if row[0] > down_at and row[1] < up_at]
            assert outage, name
            if name == "rate":
                # rate limits degrade to a local limit (1000 rpm / 2 replicas): admitted, and marked degraded
                assert all(status == 200 and degraded for _, _, status, degraded in outage), outage
            else:
                # budgets fail closed while their state is out of reach
                assert all(status == 503 for _, _, status, _ in outage), outage
            assert _recovered(rows, up_at), [row for row in rows if row[0] > up_at][-10:]

        assert metric_value(gateway.metrics(), "tidegate_store_degraded") == 0.0
        with gateway.admin() as admin:
            for key_id, name in ((rate_id, "rate"), (budget_id, "budget")):
                served = sum(1 for _, _, status, _ in results[name] if status == 200)
                usage = await wait_until_async(
                    lambda key_id=key_id, served=served: _usage_if(admin, key_id, served),
                    what=f"{name} key's usage to count its {served} served requests")
                assert usage["completion_tokens"] == 3 * served
    finally:
        gateway.stop()
        redis.stop()


def _usage_if(admin: httpx.Client, key_id: str, requests: int) -> dict[str, int] | None:
    """The key's usage once it counts `requests` (settlements made during the outage replay after it)."""
    usage: dict[str, int] = admin.get("/admin/usage", params={"key_id": key_id}).json()
    return usage if usage["requests"] == requests else None
