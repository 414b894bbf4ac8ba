"""The backend's edge against hostile clients, with the gateway's shared limits: slow headers and bodies, deeply
nested JSON, odd request ids, and a client that leaves mid-body."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Callable

import httpx
import pytest

from tests.backend.backend_process import BackendProcess
from tests.gateway.raw_http import (
    answer_to_trickled_headers,
    close_quietly,
    connect,
    read_answer,
    request_head,
)

GENERATED_ID = re.compile(r"[0-9a-f]{32}")
BODY = json.dumps({"model": "smollm2", "prompt": "hi", "max_tokens": 2}).encode()
JSON_HEADERS = {"content-type": "application/json"}


@pytest.fixture(scope="module")
def edge_backend(launch_backend: Callable[..., BackendProcess]) -> BackendProcess:
    """A backend whose limits are set by their flags, low enough to reach quickly."""
    return launch_backend("--body-timeout", "1", "--max-json-depth", "8").wait_ready()


def lines_with_status(server: BackendProcess, status: int) -> list[dict[str, object]]:
    return [line for line in server.request_lines() if line["status"] == status]


async def test_a_slow_body_gets_a_408_at_the_body_timeout(edge_backend: BackendProcess) -> None:
    reader, writer = await connect(edge_backend.port)
    writer.write(request_head("POST", "/v1/completions", JSON_HEADERS, BODY))
    writer.write(BODY[:5])  # and never the rest
    started = time.monotonic()
    answer = await asyncio.wait_for(read_answer(reader), 15)
    close_quietly(writer)
    assert answer.status == 408 and answer.json()["error"]["code"] == "request_timeout"
    assert 0.9 < time.monotonic() - started < 8.0
    assert lines_with_status(edge_backend, 408)


async def test_a_client_that_leaves_mid_body_is_logged_as_gone_and_the_server_serves_on(
        edge_backend: BackendProcess) -> None:
    _, writer = await connect(edge_backend.port)
    writer.write(request_head("POST", "/v1/completions", {**JSON_HEADERS, "x-request-id": "left-mid-body"}, BODY))
    writer.write(BODY[:5])
    await writer.drain()
    close_quietly(writer)
    deadline = time.monotonic() + 30
    while not [line for line in edge_backend.request_lines() if line["request_id"] == "left-mid-body"]:
        assert time.monotonic() < deadline, "no log line for the request whose client left"
        await asyncio.sleep(0.1)
    line = next(line for line in edge_backend.request_lines() if line["request_id"] == "left-mid-body")
    assert line["status"] == 499
    async with httpx.AsyncClient(base_url=edge_backend.url, timeout=60) as client:
        assert (await client.post("/v1/completions", content=BODY, headers=JSON_HEADERS)).status_code == 200


async def test_json_nested_past_max_json_depth_is_a_400_and_shallower_passes(edge_backend: BackendProcess) -> None:
    deep = "[" * 9 + "]" * 9  # inside the body's object: 10 levels
    deeper = "[" * 100_000 + "]" * 100_000
    async with httpx.AsyncClient(base_url=edge_backend.url, timeout=60) as client:
        for path, raw in [
            ("/v1/completions", f'{{"model":"smollm2","max_tokens":2,"prompt":{deep}}}'),
            ("/v1/completions", f'{{"model":"smollm2","max_tokens":2,"prompt":{deeper}}}'),
            ("/v1/chat/completions", f'{{"model":"smollm2","messages":[{{"role":"user","content":{deep}}}]}}'),
        ]:
            response = await client.post(path, content=raw, headers=JSON_HEADERS)
            assert response.status_code == 400, response.text[:200]
            assert response.json()["error"]["code"] == "json_too_deep"
        token_ids = json.dumps({"model": "smollm2", "max_tokens": 2, "prompt": [1, 2, 3]})
        assert (await client.post("/v1/completions", content=token_ids, headers=JSON_HEADERS)).status_code == 200


async def test_slow_headers_are_cut_with_a_408_by_the_guarded_protocol(edge_backend: BackendProcess) -> None:
    started = time.monotonic()
    answer = await answer_to_trickled_headers(edge_backend.port, byte_every=0.2, timeout=40)
    assert answer.status == 408 and answer.json()["error"]["code"] == "request_timeout"
    assert time.monotonic() - started > 9.0  # the default header deadline is 10 s


async def test_only_request_ids_of_the_shared_rule_are_kept(edge_backend: BackendProcess) -> None:
    async with httpx.AsyncClient(base_url=edge_backend.url, timeout=60) as client:
        for given, kept in [("gw-1.A_b", True), ("a" * 128, True), ("has:colon", False), ("a" * 129, False)]:
            response = await client.post("/v1/completions", content=BODY,
                                         headers={**JSON_HEADERS, "x-request-id": given})
            assert response.status_code == 200
            echoed = response.headers["x-request-id"]
            assert echoed == given if kept else GENERATED_ID.fullmatch(echoed), (given, echoed)
