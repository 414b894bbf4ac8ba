"""The Responses API's `mcp` tool and the Messages API's `mcp_servers` against the bundled backend: the model's
call runs through the gateway's MCP call path, its result goes back to the model, and one answer shows the
call and the model's reply."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable

import anthropic
import openai
import pytest

from tests.gateway.harness import GatewayHarness
from tests.gateway.mcp.conftest import ToolServers

StartGateway = Callable[..., Awaitable[GatewayHarness]]
ADD_ONLY = {"type": "mcp", "server_label": "alpha", "allowed_tools": ["add"], "require_approval": "never"}


@pytest.fixture
async def tool_gateway(tool_servers: ToolServers, gateway_for: StartGateway, backend_url: str) -> GatewayHarness:
    alpha = tool_servers("alpha")
    return await gateway_for([], channels=[{"name": "backend", "base_url": backend_url, "models": ["smollm2"]}],
                             timeouts={"first_token": 100.0, "total": 120.0},
                             mcp_servers=[{"name": "alpha", "url": f"{alpha.url}/mcp"}])


async def test_a_responses_request_with_an_mcp_tool_completes_a_tool_round_trip(
        tool_gateway: GatewayHarness) -> None:
    key_id, secret = await tool_gateway.key()
    client = tool_gateway.client(secret, timeout=300)
    response = await client.responses.create(
        model="smollm2", input="Use the tool to add 2 and 3.", tools=[ADD_ONLY],  # type: ignore[list-item]
        tool_choice="required", parallel_tool_calls=False, max_tool_calls=1, max_output_tokens=64,
        temperature=0)
    kinds = [item.type for item in response.output]
    assert kinds == ["mcp_list_tools", "mcp_call", "message"], kinds
    listing, call = response.output[0], response.output[1]
    assert listing.type == "mcp_list_tools" and [t.name for t in listing.tools] == ["add"]
    assert call.type == "mcp_call" and call.server_label == "alpha" and call.name == "add" and call.error is None
    arguments = json.loads(call.arguments)
    assert float(call.output or "nan") == arguments["a"] + arguments["b"]  # the server's answer, relayed
    assert response.usage is not None and response.usage.output_tokens > 0
    rows = {row["model"]: row for row in (await tool_gateway.usage(key_id=key_id, group_by="model"))["data"]}
    assert rows["mcp:alpha__add"]["requests"] == 1 and rows["smollm2"]["requests"] == 2  # a call, two rounds
    stored = await client.responses.retrieve(response.id)
    assert [item.type for item in stored.output] == kinds


async def test_a_streamed_request_with_an_mcp_tool_gets_the_whole_response_as_events(
        tool_gateway: GatewayHarness) -> None:
    _, secret = await tool_gateway.key()
    client = tool_gateway.client(secret, timeout=300)
    stream = await client.responses.create(
        model="smollm2", input="Use the tool to add 2 and 3.", tools=[ADD_ONLY],  # type: ignore[list-item]
        tool_choice="required", parallel_tool_calls=False, max_tool_calls=1, max_output_tokens=64,
        temperature=0, stream=True)
    events = [event async for event in stream]
    assert [e.type for e in events[:2]] == ["response.created", "response.in_progress"]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    last = events[-1]
    assert last.type in ("response.completed", "response.incomplete")
    kinds = [item.type for item in last.response.output]
    assert kinds == ["mcp_list_tools", "mcp_call", "message"], kinds
    added = [e.item.type for e in events if e.type == "response.output_item.added"]
    assert added == kinds


async def test_mcp_tools_that_cannot_run_are_400s(tool_gateway: GatewayHarness) -> None:
    _, secret = await tool_gateway.key()
    client = tool_gateway.client(secret)
    for tool, param in (({**ADD_ONLY, "server_label": "nowhere"}, "tools[0].server_label"),
                        ({**ADD_ONLY, "require_approval": "always"}, "tools[0].require_approval"),
                        ({**ADD_ONLY, "headers": {"authorization": "x"}}, "tools[0].headers"),
                        ({**ADD_ONLY, "server_url": "https://elsewhere.example/mcp"}, "tools[0].server_url")):
        with pytest.raises(openai.BadRequestError) as refused:
            await client.responses.create(model="smollm2", input="hi", tools=[tool])  # type: ignore[list-item]
        assert refused.value.body["param"] == param  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        await client.responses.create(model="smollm2", input="hi", tools=[ADD_ONLY], max_tool_calls=0)  # type: ignore[list-item]


async def test_a_messages_request_with_mcp_servers_completes_a_tool_round_trip(
        tool_gateway: GatewayHarness, tool_servers: ToolServers) -> None:
    key_id, secret = await tool_gateway.key()
    client = anthropic.AsyncAnthropic(base_url=tool_gateway.url, api_key=secret, max_retries=0, timeout=300)
    alpha_url = next(s["url"] for s in (await tool_gateway.admin.get("/admin/mcp-servers")).json()["data"])
    message = await client.beta.messages.create(
        model="smollm2", max_tokens=64, betas=["mcp-client-2025-04-04"],
        messages=[{"role": "user", "content": "Use the tool to add 2 and 3."}],
        tool_choice={"type": "any", "disable_parallel_tool_use": True},
        mcp_servers=[{"type": "url", "url": alpha_url, "name": "alpha",
                      "tool_configuration": {"allowed_tools": ["add"]}}])
    kinds = [block.type for block in message.content]
    assert kinds[:2] == ["mcp_tool_use", "mcp_tool_result"] and "mcp_tool_use" not in kinds[2:], kinds
    use, result = message.content[0], message.content[1]
    assert use.type == "mcp_tool_use" and use.name == "add" and use.server_name == "alpha"
    assert result.type == "mcp_tool_result" and not result.is_error
    assert not isinstance(result.content, str)
    assert float(result.content[0].text) == use.input["a"] + use.input["b"]  # type: ignore[index]
    rows = {row["model"]: row for row in (await tool_gateway.usage(key_id=key_id, group_by="model"))["data"]}
    assert rows["mcp:alpha__add"]["requests"] >= 1 and rows["smollm2"]["requests"] >= 2
    with pytest.raises(anthropic.BadRequestError):
        await client.beta.messages.create(model="smollm2", max_tokens=8, messages=[{"role": "user", "content": "hi"}],
                                          mcp_servers=[{"type": "url", "url": alpha_url, "name": "alpha",
                                                        "authorization_token": "t"}], betas=["mcp-client-2025-04-04"])


async def test_a_streamed_messages_request_with_mcp_servers_reads_as_a_stream(tool_gateway: GatewayHarness) -> None:
    _, secret = await tool_gateway.key()
    client = anthropic.AsyncAnthropic(base_url=tool_gateway.url, api_key=secret, max_retries=0, timeout=300)
    alpha_url = next(s["url"] for s in (await tool_gateway.admin.get("/admin/mcp-servers")).json()["data"])
    async with client.beta.messages.stream(
            model="smollm2", max_tokens=64, betas=["mcp-client-2025-04-04"],
            messages=[{"role": "user", "content": "Use the tool to add 2 and 3."}],
            tool_choice={"type": "any", "disable_parallel_tool_use": True},
            mcp_servers=[{"type": "url", "url": alpha_url, "name": "alpha",
                          "tool_configuration": {"allowed_tools": ["add"]}}]) as stream:
        message = await stream.get_final_message()
    kinds = [block.type for block in message.content]
    assert kinds[:2] == ["mcp_tool_use", "mcp_tool_result"], kinds
    use = message.content[0]
    assert use.type == "mcp_tool_use" and use.server_name == "alpha" and set(use.input) == {"a", "b"}  # type: ignore[arg-type]
    assert message.stop_reason is not None and message.usage.output_tokens > 0
