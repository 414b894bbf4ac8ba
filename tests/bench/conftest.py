"""Bench fixtures: the local tokenizer (loaded once) and the scripted mock server."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

import pytest

from bench.scripted_server import Script, serve
from bench.tokenizer import PromptTokenizer, load_tokenizer


@pytest.fixture(scope="session")
def tokenizer(model_path: Path) -> PromptTokenizer:
    return load_tokenizer(model_path)


@pytest.fixture
def mock(tokenizer: PromptTokenizer) -> Iterator[Callable[..., AbstractContextManager[str]]]:
    """`with mock(Script(...)) as url:` runs a scripted server that counts prompt tokens exactly."""

    def start(script: Script) -> AbstractContextManager[str]:
        script.count_tokens = tokenizer.count
        return serve(script)

    yield start
