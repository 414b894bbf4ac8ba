"""Fuzzing a server with schemathesis over the OpenAPI document it publishes itself."""

from __future__ import annotations

import json
from typing import Any

import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode


def assert_openai_error(response: Any) -> None:
    assert response.status_code < 500, (response.status_code, response.text[:500])
    if response.status_code >= 400:
        error = json.loads(response.text)["error"]
        assert isinstance(error["message"], str) and error["message"]
        assert isinstance(error["type"], str)


def fuzz(base_url: str, token_for: Any, examples: int) -> int:
    """Every operation of the server's own /openapi.json, valid and invalid inputs; returns the call count."""
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    calls = 0
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):

            @given(case=operation.as_strategy(generation_mode=mode))
            @settings(max_examples=examples, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            def run(case: Any) -> None:
                nonlocal calls
                token = token_for(case.path)
                response = case.call(base_url=base_url, headers={"authorization": f"Bearer {token}"}, timeout=60)
                calls += 1
                assert_openai_error(response)

            try:
                run()
            except Unsatisfiable:
                assert mode is GenerationMode.NEGATIVE  # nothing to break in an operation without inputs
    return calls
