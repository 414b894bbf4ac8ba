"""Real MCP servers (the SDK's, tests/gateway/mcp/tool_server.py) as child processes on loopback, and the
official MCP client pointed at a gateway's /mcp with an API key."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.servers import ChildProcess, free_port

ToolServers = Callable[..., ChildProcess]


@pytest.fixture
def tool_servers(tmp_path: Path) -> Iterator[ToolServers]:
    """Starts MCP servers on demand (`tool_servers("alpha", bearer="...", stateful=True)`) and stops them all afterwards."""
    started: list[ChildProcess] = []

    def start(name: str, bearer: str | None = None, stateful: bool = False) -> ChildProcess:
        port = free_port()
        argv = [sys.executable, "-m", "tests.gateway.mcp.tool_server", name, str(port), *([bearer] if bearer else [])]
        env = {"TOOL_SERVER_STATEFUL": "1"} if stateful else {}
        server = ChildProcess(argv, tmp_path / f"mcp-{name}.log", port, env=env)
        started.append(server)
        return server.start(health_timeout=60)

    yield start
    for server in started:
        server.stop()


@asynccontextmanager
async def mcp_client(gateway_url: str, secret: str, mode: str = "auto") -> AsyncIterator[Client]:
    """The official MCP client on the gateway's /mcp, sending the API key as a bearer token; `mode: legacy` speaks
    the handshake era of the protocol (initialize first), `auto` the newest both sides know."""
    async with httpx2.AsyncClient(headers={"authorization": f"Bearer {secret}"}, timeout=30) as http, \
            Client(streamable_http_client(f"{gateway_url}/mcp", http_client=http), cache=None, mode=mode) as client:
        yield client
