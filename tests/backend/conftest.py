"""Fixtures of the backend tests (append new ones; several engineers share this file)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.backend.backend_process import BackendProcess


@pytest.fixture(scope="module")
def launch_backend(model_path: Path,
                   tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[..., BackendProcess]]:
    """Starts real `tidegate backend` processes serving SmolLM2 as `smollm2` (call `.wait_ready()` on each);
    all are stopped when the module ends. Share one per module: a model load costs seconds."""
    started: list[BackendProcess] = []

    def launch(*args: str, env: dict[str, str] | None = None) -> BackendProcess:
        log_path = tmp_path_factory.mktemp("backend") / "server.log"
        server = BackendProcess(model_path, log_path, list(args), env or {})
        started.append(server)
        return server.launch()

    try:
        yield launch
    finally:
        for server in started:
            server.stop()
