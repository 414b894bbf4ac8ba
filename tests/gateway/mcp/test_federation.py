"""/mcp through the gateway with the official MCP client against two real MCP servers: each key sees and calls
only its tools, calls are counted, charged, limited and audited, and bad input gets a clean MCP error."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest
from mcp import MCPError
from mcp_types import TextContent

from gateway.mcp.calls import RATE_LIMITED, TOO_LARGE, TOOL_REFUSED, UNKNOWN_TOOL
from tests.gateway.harness import GatewayHarness
from tests.gateway.mcp.conftest import ToolServers, mcp_client
from tests.gateway.otlp_collector import running_collector

StartGateway = Callable[..., Awaitable[GatewayHarness]]
ALPHA_KEY = "alpha-upstream-secret-93f1c7"
TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def text(result: Any) -> str:
    content = result.content[0]
    assert isinstance(content, TextContent)
    return content.text


@pytest.fixture
async def federated(tool_servers: ToolServers, gateway_for: StartGateway) -> GatewayHarness:
    alpha, beta = tool_servers("alpha", bearer=ALPHA_KEY), tool_servers("beta")
    return await gateway_for([], mcp_servers=[
        {"name": "alpha", "url": f"{alpha.url}/mcp", "api_key": ALPHA_KEY, "max_argument_bytes": 256,
         "max_result_bytes": 1000, "price_per_call": 0.25},
        {"name": "beta", "url": f"{beta.url}/mcp"}])


async def test_a_key_lists_and_calls_only_the_tools_its_allowlist_names(federated: GatewayHarness) -> None:
    _, every_alpha = await federated.key(models=["mcp:alpha__*"])
    _, one_beta = await federated.key(models=["mcp:beta__echo", "smollm2"])
    _, unrestricted = await federated.key()
    async with mcp_client(federated.url, every_alpha) as client:
        assert sorted(t.name for t in (await client.list_tools()).tools) == [
            "alpha__add", "alpha__big", "alpha__context", "alpha__echo", "alpha__sleep"]
        assert text(await client.call_tool("alpha__add", {"a": 2, "b": 3})) == "5"
        with pytest.raises(MCPError) as refused:
            await client.call_tool("beta__echo", {"text": "hi"})
        assert refused.value.code == TOOL_REFUSED and refused.value.data["status"] == 403
    async with mcp_client(federated.url, one_beta) as client:
        assert [t.name for t in (await client.list_tools()).tools] == ["beta__echo"]
        assert text(await client.call_tool("beta__echo", {"text": "hi"})) == "beta: hi"
    async with mcp_client(federated.url, unrestricted) as client:
        assert len((await client.list_tools()).tools) == 10


async def test_a_handshake_era_client_lists_and_calls_too(federated: GatewayHarness) -> None:
    _, secret = await federated.key(models=["mcp:beta__*"])
    async with mcp_client(federated.url, secret, mode="legacy") as client:
        assert client.protocol_version < "2026"
        assert len((await client.list_tools()).tools) == 5
        assert text(await client.call_tool("beta__add", {"a": 1, "b": 2})) == "3"


async def test_unknown_tools_and_oversized_input_or_output_get_mcp_errors_not_hangs(
        federated: GatewayHarness) -> None:
    _, secret = await federated.key()
    async with mcp_client(federated.url, secret) as client:
        for name in ("alpha__nope", "gamma__echo", "no-separator"):
            with pytest.raises(MCPError) as unknown:
                await client.call_tool(name, {})
            assert unknown.value.code == UNKNOWN_TOOL and unknown.value.data["status"] == 404
        with pytest.raises(MCPError) as too_big:
            await client.call_tool("alpha__echo", {"text": "x" * 300})
        assert too_big.value.code == TOO_LARGE and too_big.value.data["status"] == 413
        with pytest.raises(MCPError) as result_too_big:
            await client.call_tool("alpha__big", {"size": 5000})
        assert result_too_big.value.data == {"status": 502, "code": "result_too_large"}
        assert text(await client.call_tool("alpha__big", {"size": 10})) == "x" * 10


async def test_a_call_carries_the_servers_credentials_and_the_callers_trace(federated: GatewayHarness) -> None:
    _, secret = await federated.key()
    async with mcp_client(federated.url, secret) as client:
        seen = json.loads(text(await client.call_tool("alpha__context", {}, meta={"traceparent": TRACEPARENT})))
    assert seen["authorized"] is True
    assert seen["meta"]["traceparent"].split("-")[1] == TRACEPARENT.split("-")[1]


async def test_calls_are_counted_charged_and_audited_without_arguments(
        federated: GatewayHarness, caplog: pytest.LogCaptureFixture) -> None:
    account = await federated.account()
    key_id, secret = await federated.key(account_id=account)
    caplog.set_level(logging.INFO, logger="tidegate.gateway.mcp.audit")
    async with mcp_client(federated.url, secret) as client:
        for _ in range(3):
            await client.call_tool("alpha__echo", {"text": "private words"})
        await client.call_tool("beta__add", {"a": 1, "b": 1})
    usage = await federated.usage(key_id=key_id, group_by="model")
    rows = {row["model"]: row for row in usage["data"]}
    assert rows["mcp:alpha__echo"]["requests"] == 3 and rows["mcp:beta__add"]["requests"] == 1
    assert rows["mcp:alpha__echo"]["cost"] == pytest.approx(0.75) and rows["mcp:beta__add"]["cost"] == 0
    metrics = (await federated.admin.get("/metrics")).text
    assert 'tidegate_mcp_calls_total{outcome="ok",server="alpha",tool="echo"} 3.0' in metrics
    assert 'tidegate_mcp_call_seconds_count{server="beta"} 1.0' in metrics
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "tidegate.gateway.mcp.audit"]
    assert [(line["key_id"], line["server"], line["tool"], line["outcome"]) for line in lines] == [
        (key_id, "alpha", "echo", "ok")] * 3 + [(key_id, "beta", "add", "ok")]
    assert "private words" not in caplog.text and all(line["latency_ms"] > 0 for line in lines)
    records = (await federated.admin.get(f"/admin/accounts/{account}/requests")).json()["data"]
    assert sorted((r["model"], r["channel"], r["outcome"]) for r in records) == [
        ("mcp:alpha__echo", "mcp:alpha", "ok")] * 3 + [("mcp:beta__add", "mcp:beta", "ok")]


async def test_an_account_that_opts_in_has_its_arguments_audited(
        tool_servers: ToolServers, gateway_for: StartGateway, caplog: pytest.LogCaptureFixture) -> None:
    beta = tool_servers("beta")
    gateway = await gateway_for([])
    account = await gateway.account()
    created = await gateway.admin.post("/admin/mcp-servers", json={
        "name": "beta", "url": f"{beta.url}/mcp", "log_arguments_for": [account]})
    assert created.status_code == 201, created.text
    _, secret = await gateway.key(account_id=account)
    caplog.set_level(logging.INFO, logger="tidegate.gateway.mcp.audit")
    async with mcp_client(gateway.url, secret) as client:
        await client.call_tool("beta__echo", {"text": "logged words"})
    assert '"arguments":{"text":"logged words"}' in caplog.text


async def test_past_its_rpm_a_key_gets_a_429_with_retry_after(federated: GatewayHarness) -> None:
    _, secret = await federated.key(quota={"rpm": 2})
    async with mcp_client(federated.url, secret) as client:
        for _ in range(2):
            await client.call_tool("beta__echo", {"text": "hi"})
        with pytest.raises(MCPError) as limited:
            await client.call_tool("beta__echo", {"text": "hi"})
    assert limited.value.code == RATE_LIMITED
    assert limited.value.data["status"] == 429 and limited.value.data["retry_after"] > 0
    async with httpx.AsyncClient() as http:  # what a proxy or a plain HTTP client sees of the same refusal
        answer = await http.post(f"{federated.url}/mcp", headers={
            "authorization": f"Bearer {secret}", "accept": "application/json, text/event-stream"}, json={
            "jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "beta__echo", "arguments": {}}})
    assert answer.status_code == 429 and int(answer.headers["retry-after"]) >= 1
    assert answer.headers["x-ratelimit-limit-requests"] == "2"
    assert answer.json()["id"] == 7 and answer.json()["error"]["code"] == RATE_LIMITED
    metrics = (await federated.admin.get("/metrics")).text
    assert 'tidegate_mcp_calls_total{outcome="rate_limit_exceeded",server="beta",tool="echo"} 2.0' in metrics


async def test_mcp_without_a_valid_key_is_a_401_and_broken_requests_are_4xx(federated: GatewayHarness) -> None:
    _, secret = await federated.key()
    accept = "application/json, text/event-stream"
    async with httpx.AsyncClient(base_url=federated.url) as http:
        answer = await http.post("/mcp", json={"jsonrpc": "2.0", "id": 1, "method": "tools/list"},
                                 headers={"authorization": "Bearer tg-wrong", "accept": accept})
        assert answer.status_code == 401 and answer.json()["error"]["code"] == "invalid_api_key"
        assert (await http.post("/mcp", json={})).status_code == 401
        authorized = {"authorization": f"Bearer {secret}", "accept": accept, "content-type": "application/json"}
        for body in (b"{not json", b"[]", b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": 7}',
                     b'{"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": 7}}'):
            broken = await http.post("/mcp", content=body, headers=authorized)
            assert 400 <= broken.status_code < 500 or "error" in broken.json(), (body, broken.status_code)
            assert broken.status_code != 500
        assert (await http.get("/mcp", headers=authorized)).status_code == 405


async def test_with_tracing_on_a_call_is_one_trace_from_the_client_through_the_gateway_to_the_server(
        tool_servers: ToolServers, gateway_for: StartGateway) -> None:
    alpha = tool_servers("alpha")
    with running_collector() as collector:
        gateway = await gateway_for([], tracing={"exporter": "otlp", "otlp_endpoint": collector.endpoint},
                                    mcp_servers=[{"name": "alpha", "url": f"{alpha.url}/mcp"}])
        _, secret = await gateway.key()
        async with mcp_client(gateway.url, secret) as client:
            seen = json.loads(text(await client.call_tool("alpha__context", {}, meta={"traceparent": TRACEPARENT})))
        _, trace_id, sent_span, _ = seen["meta"]["traceparent"].split("-")
        spans = await asyncio.to_thread(collector.wait_for, lambda found: any(s.span_id == sent_span for s in found))
    by_id = {s.span_id: s for s in spans}
    attempt = by_id[sent_span]  # the server's parent: the gateway's span of the call it sent
    request = by_id[attempt.parent_span_id]
    assert attempt.name == "gateway.upstream_attempt" and request.name == "POST /mcp"
    assert trace_id == attempt.trace_id == request.trace_id == TRACEPARENT.split("-")[1]
    assert request.parent_span_id == TRACEPARENT.split("-")[2]  # the client's span
