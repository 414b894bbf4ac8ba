"""The gateway keeps one MCP session per server across calls: a server restarted between two calls (forgetting
its sessions, when it keeps any) still answers the second; a removed or changed server's session is closed, and a
stopping gateway closes them all."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import mcp_types as types
import pytest

from tests.gateway.harness import GatewayHarness
from tests.gateway.mcp.conftest import ToolServers, mcp_client
from tests.waiting import wait_until_async

StartGateway = Callable[..., Awaitable[GatewayHarness]]


def text(result: types.CallToolResult) -> str:
    content = result.content[0]
    assert isinstance(content, types.TextContent)
    return content.text


@pytest.mark.parametrize("stateful", [False, True], ids=["modern", "handshake-sessions"])
async def test_a_server_restarted_between_two_calls_answers_the_second(
        tool_servers: ToolServers, gateway_for: StartGateway, stateful: bool) -> None:
    alpha = tool_servers("alpha", stateful=stateful)
    gateway = await gateway_for([], mcp_servers=[{"name": "alpha", "url": f"{alpha.url}/mcp"}])
    _, secret = await gateway.key()
    upstream = gateway.state().mcp.servers["alpha"]
    async with mcp_client(gateway.url, secret) as client:
        assert text(await client.call_tool("alpha__echo", {"text": "one"})) == "alpha: one"
        assert text(await client.call_tool("alpha__add", {"a": 1, "b": 2})) == "3"
        assert upstream.sessions == 1  # both calls went over the one session
        alpha.kill()
        alpha.start(health_timeout=60)
        assert text(await client.call_tool("alpha__echo", {"text": "two"})) == "alpha: two"
        assert upstream.breaker.state.value == "closed"


async def test_a_removed_server_has_its_session_closed(tool_servers: ToolServers, gateway_for: StartGateway) -> None:
    alpha = tool_servers("alpha")
    gateway = await gateway_for([], mcp_servers=[{"name": "alpha", "url": f"{alpha.url}/mcp"}])
    _, secret = await gateway.key()
    upstream = gateway.state().mcp.servers["alpha"]
    async with mcp_client(gateway.url, secret) as client:
        assert text(await client.call_tool("alpha__echo", {"text": "one"})) == "alpha: one"
    assert upstream.sessions == 1
    removed = await gateway.admin.delete("/admin/mcp-servers/alpha")
    assert removed.status_code == 200, removed.text
    await wait_until_async(lambda: upstream.sessions == 0, what="the removed server's session to close")
    assert "alpha" not in gateway.state().mcp.servers


async def test_a_server_whose_url_changes_gets_a_new_session(
        tool_servers: ToolServers, gateway_for: StartGateway) -> None:
    alpha, beta = tool_servers("alpha"), tool_servers("beta")
    gateway = await gateway_for([], mcp_servers=[{"name": "alpha", "url": f"{alpha.url}/mcp"}])
    _, secret = await gateway.key()
    upstream = gateway.state().mcp.servers["alpha"]
    async with mcp_client(gateway.url, secret) as client:
        assert text(await client.call_tool("alpha__echo", {"text": "one"})) == "alpha: one"
        changed = await gateway.admin.patch("/admin/mcp-servers/alpha", json={"url": f"{beta.url}/mcp"})
        assert changed.status_code == 200, changed.text
        assert text(await client.call_tool("alpha__echo", {"text": "two"})) == "beta: two"
        await wait_until_async(lambda: upstream.sessions == 1, what="the old session to close")


async def test_a_stopping_gateway_closes_its_sessions(tool_servers: ToolServers, gateway_for: StartGateway) -> None:
    alpha = tool_servers("alpha")
    gateway = await gateway_for([], mcp_servers=[{"name": "alpha", "url": f"{alpha.url}/mcp"}])
    _, secret = await gateway.key()
    upstream = gateway.state().mcp.servers["alpha"]
    async with mcp_client(gateway.url, secret) as client:
        assert text(await client.call_tool("alpha__echo", {"text": "one"})) == "alpha: one"
    assert upstream.sessions == 1
    await gateway.stop()
    assert upstream.sessions == 0  # closed by the time the gateway's shutdown returns
