"""Shared fixtures for the gateway tests: scripted upstreams on loopback."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from tests.gateway.upstreams import Fault, MockUpstream


@pytest.fixture
async def upstreams() -> AsyncIterator[Callable[..., Awaitable[MockUpstream]]]:
    """Starts mock upstreams on demand (`await upstreams(Fault.cut)`) and stops them all afterwards."""
    started: list[MockUpstream] = []

    async def start(fault: Fault = Fault.none, chunk_delay: float = 0.0) -> MockUpstream:
        upstream = await MockUpstream(fault=fault, chunk_delay=chunk_delay).start()
        started.append(upstream)
        return upstream

    yield start
    for upstream in started:
        await upstream.stop()
