"""Bad input against a backend process: schemathesis over its own /openapi.json, plus raw-byte cases."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.reliability.fuzzing import assert_openai_error, fuzz
from tests.reliability.processes import Process, backend_process


@pytest.fixture(scope="module")
def backend(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[Process]:
    # a short context keeps every valid generated case (any max_tokens that fits) quick on a CPU
    process = backend_process(tmp_path_factory.mktemp("backend-fuzz"), model_path, "backend", None,
                              "--max-model-len", "64", "--kv-cache-memory", "32MiB", "--threads", "1")
    yield process.start(health_timeout=180)
    process.stop()


def test_fuzzed_requests_never_get_a_5xx(backend: Process) -> None:
    assert fuzz(backend.url, lambda path: "unused", examples=6) >= 20
    assert httpx.get(f"{backend.url}/health", timeout=10).status_code == 200


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (b'{"model": "smollm2", "prompt": "' + b"a" * 10_000_000 + b'"}', 413),
        (b'{"model": "smollm2", "prompt": "\xff\xfe"}', 400),
        (b'{"model": "smollm2", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}", 400),
        (b"model=smollm2", 400),
        (json.dumps({"model": "smollm2", "prompt": "hi", "max_tokens": 10**12}).encode(), 400),
        (json.dumps({"model": "smollm2", "prompt": "hi", "max_tokens": -1}).encode(), 400),
        (json.dumps({"model": "smollm2", "prompt": "hi", "temperature": -1}).encode(), 400),
        (json.dumps({"model": "smollm2", "prompt": ""}).encode(), 400),
        (json.dumps({"model": "nope", "prompt": "hi"}).encode(), 404),
    ],
    ids=["10MB", "invalid-utf8", "deep-nesting", "not-json", "huge-max-tokens", "negative-max-tokens",
         "negative-temperature", "empty-prompt", "unknown-model"],
)
def test_raw_bad_bodies(backend: Process, body: bytes, expected: int) -> None:
    response = httpx.post(f"{backend.url}/v1/completions", content=body, timeout=60,
                          headers={"content-type": "application/json"})
    assert response.status_code == expected, response.text[:300]
    assert_openai_error(response)
