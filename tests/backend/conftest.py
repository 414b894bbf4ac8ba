"""Fixtures of the backend tests (append new ones; several engineers share this file)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.backend.backend_process import BackendProcess

# Session fixtures run once per run only when defined once: an alias of one in a test module is a fixture of
# its own, so each such module had built its own (the transformers reference alone is a minute).
from tests.backend.engine_fixtures import make_engine, prompt_ids, reference_tokens  # noqa: F401


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


@pytest.fixture(scope="session")
def hf_tokenizer(model_path: Path) -> Any:
    """transformers' tokenizer over the default GGUF, the reference of the tokenizer and chat template tests: its
    conversion from GGUF takes ~10 s, so it is built once per run."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(model_path.parent), gguf_file=model_path.name)


@pytest.fixture(scope="session")
def gguf_metadata(model_path: Path) -> dict[str, Any]:
    """The default GGUF's key/values: gguf's reader maps every tensor of the file first (8-18 s here), so the
    modules that build a tokenizer from them read it once per run."""
    from gguf import GGUFReader

    from backend.loading.gguf.weights import read_metadata

    return read_metadata(GGUFReader(model_path))
