"""One tenant's slow-to-compile schemas cannot deny structured output to another: compiles are killed at their
deadline and capped per tenant (the gateway's cache salt), against a real backend replica."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import httpx

from tests.backend.backend_process import BackendProcess
from tests.backend.engine.test_structured_output import PERSON, slow_schema


def _body(schema: dict[str, Any], salt: str) -> dict[str, Any]:
    return {"model": "smollm2", "messages": [{"role": "user", "content": "A person as JSON."}], "max_tokens": 40,
            "temperature": 0, "cache_salt": salt,
            "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}}


async def test_ten_slow_schemas_of_one_tenant_leave_structured_output_to_another(
        launch_backend: Callable[..., BackendProcess]) -> None:
    # the attack: ten distinct 13 kB schemas, each ~18 s to compile, filled both compile workers and every pending
    # slot for minutes, so every tenant's structured output was refused or timed out
    backend = launch_backend("--grammar-compile-timeout", "2").wait_ready()
    async with httpx.AsyncClient(base_url=backend.base_url, timeout=120) as client:
        flood = [asyncio.create_task(client.post("/chat/completions", json=_body(slow_schema(120, i), "tenant-a")))
                 for i in range(10)]
        # the flood fills tenant a's share first: its refusals beyond the share come back at once
        done, _ = await asyncio.wait(flood, timeout=60, return_when=asyncio.FIRST_COMPLETED)
        assert done, "no compile of tenant a was refused or answered within 60 s"
        started = time.monotonic()
        other = await client.post("/chat/completions", json=_body(PERSON, "tenant-b"))
        served_after = time.monotonic() - started
        answers = await asyncio.gather(*flood)
    assert other.status_code == 200, other.text
    assert json.loads(other.json()["choices"][0]["message"]["content"]).keys() <= PERSON["properties"].keys()
    assert served_after < 60  # its own compile (and a child's start), never the attacker's 18 s compiles
    statuses = sorted(a.status_code for a in answers)
    assert set(statuses) <= {400, 429} and 400 in statuses, statuses
    too_complex = next(a for a in answers if a.status_code == 400).json()["error"]
    assert "too complex to compile within 2s" in too_complex["message"]
    assert too_complex["param"] == "response_format.json_schema.schema"
    refused = next(a for a in answers if a.status_code == 429)
    assert refused.json()["error"]["code"] == "too_many_compiles" and refused.headers["retry-after"]
