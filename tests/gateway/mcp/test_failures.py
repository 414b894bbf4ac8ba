"""A tool server that dies mid-call or hangs: the caller gets a clean MCP error in bounded time, and the
server's breaker opens so the next calls fail at once instead of waiting on it."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
from mcp import MCPError

from tests.gateway.harness import GatewayHarness
from tests.gateway.mcp.conftest import ToolServers, mcp_client
from tests.servers import free_port
from tests.waiting import wait_until_async

StartGateway = Callable[..., Awaitable[GatewayHarness]]


async def test_a_server_killed_mid_call_gives_a_clean_error_and_opens_its_breaker(
        tool_servers: ToolServers, gateway_for: StartGateway) -> None:
    alpha = tool_servers("alpha")
    gateway = await gateway_for([], breaker={"consecutive_failures": 1, "cooldown": 60},
                                mcp_servers=[{"name": "alpha", "url": f"{alpha.url}/mcp"}])
    _, secret = await gateway.key()
    async with mcp_client(gateway.url, secret) as client:
        call = asyncio.create_task(client.call_tool("alpha__sleep", {"seconds": 30}))

        async def in_flight() -> bool:
            return bool((await gateway.admin.get("/admin/mcp-servers/alpha")).json()["in_flight"] == 1)

        await wait_until_async(in_flight, what="the call to reach the server")
        alpha.kill()
        with pytest.raises(MCPError) as broken:
            await asyncio.wait_for(call, 10)
        assert broken.value.data["status"] == 503 and broken.value.data["code"] == "unavailable"
        assert (await gateway.admin.get("/admin/mcp-servers/alpha")).json()["breaker"] == "open"
        started = time.monotonic()
        with pytest.raises(MCPError) as fast:
            await client.call_tool("alpha__echo", {"text": "hi"})
        assert fast.value.data == {"status": 503, "code": "breaker_open", "retry_after": 1.0}
        assert time.monotonic() - started < 2


async def test_a_hanging_server_times_out_at_its_call_deadline(
        tool_servers: ToolServers, gateway_for: StartGateway) -> None:
    alpha = tool_servers("alpha")
    gateway = await gateway_for([], mcp_servers=[{"name": "alpha", "url": f"{alpha.url}/mcp",
                                                  "timeouts": {"connect": 1.0, "call": 1.5}}])
    _, secret = await gateway.key()
    async with mcp_client(gateway.url, secret) as client:
        started = time.monotonic()
        with pytest.raises(MCPError) as late:
            await client.call_tool("alpha__sleep", {"seconds": 20})
        assert late.value.data == {"status": 504, "code": "timeout"}
        assert time.monotonic() - started < 10
        assert (await client.call_tool("alpha__add", {"a": 1, "b": 2})).content[0].text == "3"  # type: ignore[union-attr]


async def test_a_server_down_from_the_start_is_left_out_and_its_calls_fail_fast(
        tool_servers: ToolServers, gateway_for: StartGateway) -> None:
    beta = tool_servers("beta")
    gateway = await gateway_for([], mcp_servers=[{"name": "down", "url": f"http://127.0.0.1:{free_port()}/mcp"},
                                                 {"name": "beta", "url": f"{beta.url}/mcp"}])
    _, secret = await gateway.key()
    async with mcp_client(gateway.url, secret) as client:
        assert {t.name.split("__")[0] for t in (await client.list_tools()).tools} == {"beta"}
        started = time.monotonic()
        with pytest.raises(MCPError) as down:
            await client.call_tool("down__echo", {"text": "hi"})
        assert down.value.data == {"status": 503, "code": "unavailable", "retry_after": 1.0}
        assert time.monotonic() - started < 5
