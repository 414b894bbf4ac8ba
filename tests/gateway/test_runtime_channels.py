"""Channels changed at run time through the admin API: every replica follows within a second, draining drops
nothing, and a channel's api_key never comes back out."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx

from tests.gateway.harness import ADMIN_KEY, GatewayHarness
from tests.gateway.upstreams import MockUpstream
from tests.reliability.processes import ADMIN_KEY as PROCESS_ADMIN_KEY
from tests.reliability.processes import GatewayProcess
from tests.servers import RedisServer
from tests.waiting import wait_until_async

Start = Callable[..., Awaitable[MockUpstream]]
StartGateway = Callable[..., Awaitable[GatewayHarness]]
HI = [{"role": "user", "content": "hi"}]
CHANNEL_SECRET = "sk-channel-secret-4b9e1f7a2c6d8035"


async def answers(url: str, secret: str, model: str) -> int:
    async with httpx.AsyncClient(base_url=url, timeout=10) as client:
        response = await client.post("/v1/chat/completions", headers={"authorization": f"Bearer {secret}"},
                                     json={"model": model, "messages": HI, "max_tokens": 2})
    return response.status_code


async def test_a_channel_added_on_one_replica_serves_on_both_within_a_second(
        upstreams: Start, redis_server: RedisServer, tmp_path: Path) -> None:
    first, added = await upstreams(), await upstreams()
    one, two = (GatewayProcess.create(tmp_path, [first.base_url], redis_url=redis_server.url) for _ in range(2))
    try:
        # launched together and awaited off the loop, which serves the upstreams meanwhile
        await asyncio.gather(*(asyncio.to_thread(g.start) for g in (one, two)))
        await runtime_channel_checks(one, two, added)
    finally:
        for gateway in (one, two):
            gateway.stop()


async def runtime_channel_checks(one: GatewayProcess, two: GatewayProcess, added: MockUpstream) -> None:
    _, secret = await asyncio.to_thread(one.new_key)
    assert await answers(two.url, secret, "extra") == 404
    admin = {"authorization": f"Bearer {PROCESS_ADMIN_KEY}"}
    async with httpx.AsyncClient(headers=admin, timeout=10) as http:
        created = await http.post(f"{one.url}/admin/channels", json={
            "name": "extra", "base_url": added.base_url, "models": {"extra": "extra-upstream"},
            "api_key": CHANNEL_SECRET})
        assert created.status_code == 201, created.text
        started = time.monotonic()
        assert await answers(one.url, secret, "extra") == 200  # the replica that took the change applies it at once

        async def second_serves() -> bool:
            return await answers(two.url, secret, "extra") == 200

        await wait_until_async(second_serves, timeout=5, what="the second replica serving it", interval=0.05)
        assert time.monotonic() - started < 1.0
        assert added.attempts >= 2

        for gateway in (one, two):
            shown = (await http.get(f"{gateway.url}/admin/channels/extra")).text
            assert '"api_key_set":true' in shown and CHANNEL_SECRET not in shown
        assert CHANNEL_SECRET not in created.text
        conflict = await http.post(f"{two.url}/admin/channels", json={"name": "extra", "base_url": added.base_url,
                                                                     "models": ["extra"]})
        assert conflict.status_code == 409
        bad = await http.post(f"{one.url}/admin/channels", json={
            "name": "x", "base_url": "ftp://nowhere", "models": ["m"], "api_key": CHANNEL_SECRET})
        assert bad.status_code == 400 and CHANNEL_SECRET not in bad.text
    for gateway in (one, two):
        assert CHANNEL_SECRET not in gateway.log_path.read_text()


async def test_draining_a_channel_under_load_drops_nothing_and_then_removes_it(
        upstreams: Start, gateway_for: StartGateway) -> None:
    slow, other = await upstreams(chunk_delay=0.05), await upstreams()
    gateway = await gateway_for([slow, other])
    _, secret = await gateway.key()
    client = gateway.client(secret)

    async def one_request() -> str:
        answer = await client.chat.completions.create(model="smollm2", messages=HI, max_tokens=8)  # type: ignore[arg-type]
        return answer.choices[0].message.content or ""

    load = [asyncio.create_task(one_request()) for _ in range(16)]

    async def slow_busy() -> bool:
        status = (await gateway.admin.get("/admin/channels/c0")).json()
        return bool(status["in_flight"] > 0)

    await wait_until_async(slow_busy, what="requests in flight on the channel to drain")
    # a change to one channel keeps the live state of the others, and its own
    busy = (await gateway.admin.get("/admin/channels/c0")).json()
    changed = await gateway.admin.patch("/admin/channels/c0", json={"weight": 2})
    assert changed.status_code == 200 and changed.json()["weight"] == 2
    assert changed.json()["models"]["smollm2"]["attempts"] >= busy["models"]["smollm2"]["attempts"] > 0
    drained = await gateway.admin.delete("/admin/channels/c0")
    assert drained.status_code == 202 and drained.json()["draining"] is True
    attempts_at_drain = slow.attempts
    more = [asyncio.create_task(one_request()) for _ in range(8)]
    results = await asyncio.gather(*load, *more)
    assert all(results)  # every request answered, none cut
    assert slow.attempts == attempts_at_drain  # nothing new went to the draining channel

    async def removed() -> bool:
        return (await gateway.admin.get("/admin/channels/c0")).status_code == 404

    await wait_until_async(removed, what="the drained channel removed")
    assert [c["name"] for c in (await gateway.admin.get("/admin/channels")).json()["data"]] == ["c1"]


async def test_the_admin_cli_adds_updates_groups_and_removes_channels(
        upstreams: Start, gateway_for: StartGateway, tmp_path: Path) -> None:
    upstream = await upstreams()
    gateway = await gateway_for([upstream])
    key_file = tmp_path / "upstream-key"
    key_file.write_text(CHANNEL_SECRET + "\n")

    async def cli(*argv: str) -> dict[str, object]:
        command = [sys.executable, "-m", "tidegate.cli", "admin", "--url", gateway.url, "--admin-key", ADMIN_KEY,
                   *argv]
        done = await asyncio.to_thread(subprocess.run, command, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr + done.stdout
        assert CHANNEL_SECRET not in done.stdout
        return dict(json.loads(done.stdout))

    added = await cli("channels", "add", "cli-1", "--base-url", upstream.base_url, "--models", "tiny=upstream-tiny",
                      "--api-key-file", str(key_file), "--no-stream-upstream", "--embeddings")
    assert added["api_key_set"] is True and added["settings"]["stream_upstream"] is False  # type: ignore[index]
    assert added["settings"]["embeddings"] is True  # type: ignore[index]
    group = await cli("model-groups", "set", "assistant", "--target", "cli-1=upstream-tiny", "--fallback", "smollm2")
    assert group["fallbacks"] == ["smollm2"]
    updated = await cli("channels", "update", "cli-1", "--weight", "3", "--kind", "azure", "--api-version", "2024-10-21")
    assert updated["weight"] == 3 and updated["api_key_set"] is True
    assert updated["settings"]["kind"] == "azure" and updated["settings"]["api_version"] == "2024-10-21"  # type: ignore[index]
    assert (await cli("channels", "remove", "cli-1"))["draining"] is True


async def test_channels_added_at_run_time_outlive_a_restart_and_the_store_wins_over_the_file(
        upstreams: Start, gateway_for: StartGateway) -> None:
    upstream = await upstreams()
    first = await gateway_for([upstream])
    added = await first.admin.post("/admin/channels", json={"name": "kept", "base_url": upstream.base_url,
                                                            "models": ["kept-model"]})
    assert added.status_code == 201
    await first.stop()
    # a restart against the same store with a config file that names other channels
    again = await gateway_for([upstream, upstream])
    names = [c["name"] for c in (await again.admin.get("/admin/channels")).json()["data"]]
    assert names == ["c0", "kept"]
    _, secret = await again.key()
    assert await answers(again.url, secret, "kept-model") == 200
