"""Fixtures shared by every test: real Redis, free ports, the real model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.servers import RedisServer, free_port


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server on a free loopback port, stopped after the test."""
    server = RedisServer(workdir=tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The default SmolLM2 GGUF, pulled into the model cache once per session."""
    from backend.loading.model_cache import pull

    return pull("smollm2", quiet=True)
