"""Shared fixtures for the gateway tests: scripted upstreams on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from common.http_client import HttpClient
from tests.backend.backend_process import BackendProcess
from tests.gateway.admin_clients import AdminGateway
from tests.gateway.harness import ADMIN_KEY, GatewayHarness, settings_for
from tests.gateway.upstreams import Fault, MockUpstream
from tests.servers import ChildProcess, free_port, tidegate_argv


@pytest.fixture
async def upstreams() -> AsyncIterator[Callable[..., Awaitable[MockUpstream]]]:
    """Starts mock upstreams on demand (`await upstreams(Fault.cut)`) and stops them all afterwards."""
    started: list[MockUpstream] = []

    async def start(fault: Fault = Fault.none, chunk_delay: float = 0.0, **fields: Any) -> MockUpstream:
        upstream = await MockUpstream(fault=fault, chunk_delay=chunk_delay, **fields).start()
        started.append(upstream)
        return upstream

    yield start
    for upstream in started:
        await upstream.stop()


@pytest.fixture
async def gateway_for(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[GatewayHarness]]]:
    """Starts a gateway in front of the given upstreams (`await gateway_for([upstream], **settings)`)."""
    started: list[GatewayHarness] = []

    async def start(targets: list[MockUpstream], **overrides: Any) -> GatewayHarness:
        settings = settings_for(tmp_path, [t.base_url for t in targets], **overrides)
        harness = await GatewayHarness(settings).start()
        started.append(harness)
        return harness

    yield start
    for harness in started:
        await harness.stop()


@pytest.fixture
async def session() -> AsyncIterator[HttpClient]:
    """The HTTP client the upstream client sends with, closed after the test."""
    client = HttpClient()
    yield client
    await client.close()


@pytest.fixture
def backend_url(shared_backend: BackendProcess) -> str:
    """The session's real `tidegate backend` replica serving the model."""
    return shared_backend.base_url


@pytest.fixture
async def backend_gateway(backend_url: str,
                          gateway_for: Callable[..., Awaitable[GatewayHarness]]) -> GatewayHarness:
    """A gateway whose one channel is the real backend, serving the model under its own name. The first-token
    deadline is long: on a shared CPU a grammar compile plus a prefill can take longer than the default 30 s."""
    return await gateway_for([], channels=[{"name": "backend", "base_url": backend_url, "models": ["smollm2"]}],
                             timeouts={"first_token": 100.0, "total": 120.0})


@pytest.fixture(scope="module")
def admin_gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[AdminGateway]:
    """A `tidegate gateway` process without channels (embedded store, no auth cache), shared by one module:
    for admin API tests, where authentication is all a key needs to show (`GET /v1/models`)."""
    workdir = tmp_path_factory.mktemp("admin-gateway")
    config = workdir / "gateway.yaml"
    config.write_text(yaml.safe_dump({"admin_key": ADMIN_KEY, "data_dir": str(workdir / "data"),
                                      "auth_cache_ttl": 0}))
    port = free_port()
    process = ChildProcess(tidegate_argv("gateway", "--config", str(config), "--port", str(port)),
                           workdir / "gateway.log", port)
    process.start(health_timeout=60)
    gateway = AdminGateway(process.url)
    try:
        yield gateway
    finally:
        for client in gateway.clients:
            client.close()
        process.stop()
