"""Fixtures shared by every test: real Redis, free ports, the real model."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.backend.backend_process import BackendProcess
from tests.redis_cluster import RedisClusterServers
from tests.servers import RedisServer, free_port

if TYPE_CHECKING:  # torch and the loader load only in runs that use the model
    from backend.loading.loader import LoadedModel


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A fresh redis-server on a free loopback port, stopped after the test."""
    server = RedisServer(workdir=tmp_path / "redis").start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_cluster_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterServers]:
    """A real Redis Cluster of three masters and three replicas on loopback, started once per session: a test
    that kills a node brings it back (`restart`) before it ends."""
    cluster = RedisClusterServers(tmp_path_factory.mktemp("redis-cluster")).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def redis_cluster(redis_cluster_servers: RedisClusterServers) -> RedisClusterServers:
    """The session's Redis Cluster, emptied for this test (what a gateway seeded once is not there for the next)."""
    redis_cluster_servers.flush()
    return redis_cluster_servers


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The default SmolLM2 GGUF, pulled into the model cache once per session."""
    from backend.loading.model_cache import pull

    return pull("smollm2", quiet=True)


@pytest.fixture(scope="session")
def loaded_model(model_path: Path) -> LoadedModel:
    """The default model loaded in this process (14 s), once per run: engine, model and bench tests share it."""
    import torch

    from backend.loading.loader import load_model

    torch.set_num_threads(1)  # under a shared CPU, 2-thread OMP barriers cost more than they win
    return load_model(model_path)


@pytest.fixture(scope="session")
def hf_model(model_path: Path) -> Any:
    """transformers' model over the same GGUF (float32), the reference of parity tests: loaded once per run, as
    the load alone takes 30 s."""
    import torch
    from transformers import AutoModelForCausalLM

    hf: Any = AutoModelForCausalLM.from_pretrained(
        str(model_path.parent), gguf_file=model_path.name, dtype=torch.float32
    )
    return hf.eval()


@pytest.fixture(scope="session")
def shared_backend(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[BackendProcess]:
    """One `tidegate backend` with its default flags, started on first use and shared by every module that needs no
    flags of its own: each model load costs 10-15 s of the suite's budget. Tests on it must not depend on what
    earlier modules left in its prefix cache or logs (use unique prompts and request ids, compare metric deltas)."""
    backend = BackendProcess(model_path, tmp_path_factory.mktemp("shared-backend") / "backend.log")
    try:
        yield backend.start(health_timeout=240)
    finally:
        backend.stop()
