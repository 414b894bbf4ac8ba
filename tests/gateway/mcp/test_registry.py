"""MCP servers registered at run time: an admin API change reaches every replica sharing the store within a
second, the server's api_key never comes back out, and bad records are 4xx answers."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

from tests.gateway.harness import GatewayHarness
from tests.gateway.mcp.conftest import ToolServers, mcp_client
from tests.servers import RedisServer
from tests.waiting import wait_until_async

StartGateway = Callable[..., Awaitable[GatewayHarness]]
SECRET = "sk-mcp-upstream-7d2e91c4b8a3"


async def tool_names(gateway: GatewayHarness, secret: str) -> list[str]:
    async with mcp_client(gateway.url, secret) as client:
        return sorted(t.name for t in (await client.list_tools()).tools)


async def test_a_server_added_on_one_replica_is_usable_on_the_other_within_a_second(
        tool_servers: ToolServers, gateway_for: StartGateway, redis_server: RedisServer) -> None:
    beta = tool_servers("beta", bearer=SECRET)
    one = await gateway_for([], redis_url=redis_server.url)
    two = await gateway_for([], redis_url=redis_server.url, data_dir=str(one.settings.resolved_data_dir() / "2"))
    _, secret = await one.key(models=["mcp:beta__*"])
    assert await tool_names(two, secret) == []
    created = await one.admin.post("/admin/mcp-servers", json={"name": "beta", "url": f"{beta.url}/mcp",
                                                               "api_key": SECRET})
    assert created.status_code == 201, created.text
    started = time.monotonic()

    async def second_lists() -> bool:
        return "beta__echo" in await tool_names(two, secret)

    await wait_until_async(second_lists, timeout=5, what="the second replica listing the tools", interval=0.05)
    assert time.monotonic() - started < 1.0
    async with mcp_client(two.url, secret) as client:
        assert (await client.call_tool("beta__add", {"a": 20, "b": 22})).content[0].text == "42"  # type: ignore[union-attr]
    for gateway in (one, two):
        shown = (await gateway.admin.get("/admin/mcp-servers/beta")).text
        assert '"api_key_set":true' in shown and SECRET not in shown and "beta__echo" in shown
    removed = await two.admin.delete("/admin/mcp-servers/beta")
    assert removed.status_code == 200

    async def first_forgets() -> bool:
        return await tool_names(one, secret) == []

    await wait_until_async(first_forgets, timeout=5, what="the first replica dropping the server")


async def test_bad_server_records_are_4xx_and_never_echo_the_key(gateway_for: StartGateway) -> None:
    gateway = await gateway_for([])
    for body in ({"name": "has_underscore", "url": "http://127.0.0.1:1/mcp"},
                 {"name": "x", "url": "ftp://nowhere", "api_key": SECRET},
                 {"name": "x", "url": "http://127.0.0.1:1/mcp", "api_key_file": "/etc/passwd"},
                 {"name": "x", "url": "http://127.0.0.1:1/mcp", "timeouts": {"call": -1}},
                 {"name": "x", "url": "http://127.0.0.1:1/mcp", "surprise": True}):
        answer = await gateway.admin.post("/admin/mcp-servers", json=body)
        assert answer.status_code == 400 and SECRET not in answer.text, answer.text
        assert set(answer.json()["error"]) == {"message", "type", "param", "code"}
    added = await gateway.admin.post("/admin/mcp-servers", json={"name": "x", "url": "http://127.0.0.1:1/mcp",
                                                                 "api_key": SECRET})
    assert added.status_code == 201
    assert (await gateway.admin.post("/admin/mcp-servers", json={"name": "x", "url": "http://h/mcp"})).status_code == 409
    moved = await gateway.admin.patch("/admin/mcp-servers/x", json={"url": "http://127.0.0.1:2/mcp"})
    assert moved.status_code == 200 and moved.json()["api_key_set"] is False  # a key never follows a new URL
    assert (await gateway.admin.patch("/admin/mcp-servers/x", json={"name": "y"})).status_code == 400
    assert (await gateway.admin.get("/admin/mcp-servers/nope")).status_code == 404
    assert [s["name"] for s in (await gateway.admin.get("/admin/mcp-servers")).json()["data"]] == ["x"]
