"""The gateway in front of a real `tidegate backend` replica, driven by the official openai client."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib.util
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.harness import GatewayHarness
from tests.reliability.processes import metric_value
from tests.waiting import wait_until_async

pytestmark = pytest.mark.skipif(importlib.util.find_spec("backend.server") is None,
                                reason="backend/server.py has not landed")


async def backend_metric(backend_url: str, name: str, **labels: str) -> float:
    """A sample from the backend's own /metrics."""
    async with httpx.AsyncClient(timeout=10) as http:
        return metric_value((await http.get(backend_url.removesuffix("/v1") + "/metrics")).text, name, **labels)


async def test_chat_and_completions_through_the_gateway_settle_the_backends_usage(
        backend_gateway: GatewayHarness) -> None:
    gateway = backend_gateway
    key_id, secret = await gateway.key()
    client = gateway.client(secret, timeout=120)
    messages = [{"role": "user", "content": "Name a colour."}]
    chat = await client.chat.completions.create(model="smollm2", messages=messages, max_tokens=6,  # type: ignore[arg-type]
                                                temperature=0)
    assert chat.usage is not None and chat.usage.completion_tokens == 6 and chat.choices[0].message.content
    text = await client.completions.create(model="smollm2", prompt="The sky is", max_tokens=4, temperature=0)
    assert text.usage is not None and text.choices[0].text
    stream = await client.chat.completions.create(model="smollm2", messages=messages, max_tokens=5,  # type: ignore[arg-type]
                                                  temperature=0, stream=True,
                                                  stream_options={"include_usage": True})
    chunks = [chunk async for chunk in stream]
    streamed_usage = chunks[-1].usage
    assert streamed_usage is not None and streamed_usage.completion_tokens == 5
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    plain = await client.completions.create(model="smollm2", prompt="One, two,", max_tokens=3, stream=True,
                                            temperature=0)
    assert [c async for c in plain if c.usage is not None] == []  # not asked for: stripped

    usage = await gateway.usage(key_id=key_id)
    assert usage["requests"] == 4
    assert usage["completion_tokens"] == 6 + text.usage.completion_tokens + 5 + 3
    assert usage["prompt_tokens"] >= chat.usage.prompt_tokens + text.usage.prompt_tokens


@pytest.mark.parametrize(("path", "prompt"), [
    ("/chat/completions", {"messages": [{"role": "user", "content": "Name three colours."}]}),
    ("/completions", {"prompt": "A painter mixes colours on a palette every morning before work. "
                                "She knows that the three primary colours are"}),
])
async def test_an_assembled_answer_matches_the_backends_own_non_streamed_answer(
        backend_url: str, backend_gateway: GatewayHarness, path: str, prompt: dict[str, Any]) -> None:
    _, secret = await backend_gateway.key()
    body = {"model": "smollm2", **prompt, "max_tokens": 12, "temperature": 0, "seed": 11, "stream": False}
    auth = {"authorization": f"Bearer {secret}"}
    async with httpx.AsyncClient(timeout=120) as http:
        # first calls fill the prefix cache (the gateway's own, salted per account, too), so both answers below
        # report the same cached prompt tokens
        for _ in range(2):
            direct = (await http.post(backend_url + path, json=body)).json()
            via = await http.post(backend_gateway.url + "/v1" + path, json=body, headers=auth)
    assembled = via.json()
    assert via.status_code == 200, assembled
    assert assembled["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    for varies in ("id", "created"):
        assert type(assembled.pop(varies)) is type(direct.pop(varies))
    assert assembled == direct
    assert list(assembled) == list(direct) and list(assembled["choices"][0]) == list(direct["choices"][0])


async def test_a_client_that_leaves_an_assembled_answer_aborts_the_backends_generation(
        backend_url: str, backend_gateway: GatewayHarness) -> None:
    _, secret = await backend_gateway.key()
    backend = functools.partial(backend_metric, backend_url)
    aborted = "tidegate_backend_request_success_total"
    before = await backend(aborted, finished_reason="abort")
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "Tell a long story."}],
            "max_tokens": 2000, "ignore_eos": True, "temperature": 0}
    async with httpx.AsyncClient(timeout=120) as http:
        leaving = asyncio.create_task(http.post(backend_gateway.url + "/v1/chat/completions", json=body,
                                                headers={"authorization": f"Bearer {secret}"}))
        await wait_until_async(lambda: backend("tidegate_backend_num_requests_running"), timeout=60,
                               what="the backend generating")
        leaving.cancel()  # the client hangs up mid-generation
        with contextlib.suppress(asyncio.CancelledError):
            await leaving

    async def aborted_once() -> bool:
        return await backend(aborted, finished_reason="abort") == before + 1

    # 2000 tokens would take minutes on a CPU; the abort comes as soon as the gateway closes its upstream call
    await wait_until_async(aborted_once, timeout=30, what="the backend aborting the abandoned generation")
    assert await backend("tidegate_backend_num_requests_running") == 0


async def test_structured_output_and_tool_calls_pass_through_the_gateway_unchanged(
        backend_url: str, backend_gateway: GatewayHarness) -> None:
    _, secret = await backend_gateway.key()
    weather = {"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string", "maxLength": 16}}, "required": ["city"],
        "additionalProperties": False}}}
    tool_body = {"model": "smollm2", "messages": [{"role": "user", "content": "Weather in Paris?"}],
                 "max_tokens": 48, "temperature": 0, "tools": [weather], "tool_choice": "required",
                 "parallel_tool_calls": False}
    schema_body = {"model": "smollm2", "messages": [{"role": "user", "content": "Is water wet?"}],
                   "max_tokens": 16, "temperature": 0, "response_format": {
                       "type": "json_schema", "json_schema": {"name": "a", "schema": {
                           "type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
                           "required": ["answer"], "additionalProperties": False}}}}
    auth = {"authorization": f"Bearer {secret}"}
    async with httpx.AsyncClient(timeout=120) as http:
        direct, via = await asyncio.gather(
            http.post(backend_url + "/chat/completions", json=tool_body),
            http.post(backend_gateway.url + "/v1/chat/completions", json=tool_body, headers=auth))
        constrained = await http.post(backend_gateway.url + "/v1/chat/completions", json=schema_body, headers=auth)
    assert via.status_code == 200, via.text
    direct_choice, via_choice = direct.json()["choices"][0], via.json()["choices"][0]
    assert via_choice["finish_reason"] == direct_choice["finish_reason"] == "tool_calls"
    assert [c["function"] for c in via_choice["message"]["tool_calls"]] == [
        c["function"] for c in direct_choice["message"]["tool_calls"]]
    assert json.loads(constrained.json()["choices"][0]["message"]["content"])["answer"] in ("yes", "no")


async def test_n_choices_pass_through_reserved_and_charged_for_every_choice(
        backend_gateway: GatewayHarness) -> None:
    gateway = backend_gateway
    key_id, secret = await gateway.key(quota={"tpm": 300})  # one choice's 100 tokens fit; four choices' do not
    client = gateway.client(secret, timeout=120)
    messages: Any = [{"role": "user", "content": "Name a colour."}]
    with pytest.raises(openai.RateLimitError):
        await client.chat.completions.create(model="smollm2", messages=messages, max_tokens=100, n=4)
    four = await client.chat.completions.create(model="smollm2", messages=messages, max_tokens=5, n=4, seed=2,
                                                temperature=1.0, extra_body={"ignore_eos": True})
    assert [c.index for c in four.choices] == [0, 1, 2, 3] and all(c.message.content for c in four.choices)
    assert four.usage is not None and four.usage.completion_tokens == 20
    usage = await gateway.usage(key_id=key_id)
    assert usage["completion_tokens"] == 20 and usage["prompt_tokens"] >= four.usage.prompt_tokens


async def test_a_first_token_timeout_aborts_the_backends_generation_and_is_not_retried_there(
        backend_url: str, gateway_for: Callable[..., Awaitable[GatewayHarness]]) -> None:
    timeouts = {"connect": 2.0, "first_token": 0.2, "idle": 10.0, "total": 60.0}
    gateway = await gateway_for([], channels=[{"name": "backend", "base_url": backend_url, "models": ["smollm2"],
                                               "timeouts": timeouts}])
    _, secret = await gateway.key()
    backend = functools.partial(backend_metric, backend_url)
    finished = "tidegate_backend_request_success_total"
    before = {reason: await backend(finished, finished_reason=reason) for reason in ("abort", "length", "stop")}
    # a prompt whose prefill alone takes longer than first_token on a CPU
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "tide " * 3000}], "max_tokens": 200}
    async with httpx.AsyncClient(timeout=120) as http:
        answer = await http.post(gateway.url + "/v1/chat/completions", json=body,
                                 headers={"authorization": f"Bearer {secret}"})
    assert answer.status_code == 504 and answer.json()["error"]["code"] == "upstream_timeout"

    async def aborted_once() -> bool:
        return await backend(finished, finished_reason="abort") == before["abort"] + 1

    await wait_until_async(aborted_once, timeout=30, what="the backend aborting the timed-out generation")
    assert await backend("tidegate_backend_num_requests_running") == 0
    for reason in ("length", "stop"):  # no second attempt ran there
        assert await backend(finished, finished_reason=reason) == before[reason]


# the Responses API: translated to chat completions at the gateway, served by the real backend

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                          "required": ["city"], "additionalProperties": False}}


async def test_a_response_is_stored_continued_and_read_back_only_by_its_account(
        backend_gateway: GatewayHarness) -> None:
    gateway = backend_gateway
    key_id, secret = await gateway.key()
    client = gateway.client(secret, timeout=120)
    first = await client.responses.create(model="smollm2", instructions="Answer in one short sentence.",
                                          input="What colour is the sky?", max_output_tokens=8, temperature=0)
    assert first.object == "response" and first.id.startswith("resp_")
    assert first.status in ("completed", "incomplete") and first.output_text
    assert first.output[0].type == "message" and first.output[0].role == "assistant"
    assert first.usage is not None and first.usage.input_tokens > 0
    assert first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens
    assert (await client.responses.retrieve(first.id)).output_text == first.output_text

    follow = await client.responses.create(model="smollm2", previous_response_id=first.id, input="And at night?",
                                           max_output_tokens=4, temperature=0)
    assert follow.previous_response_id == first.id and follow.output_text and follow.usage is not None
    # the earlier turn (its question and answer) was sent again; its instructions were not
    assert follow.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens - 16

    other = gateway.client((await gateway.key())[1])
    with pytest.raises(openai.NotFoundError):
        await other.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        await other.responses.create(model="smollm2", previous_response_id=first.id, input="Hi", max_output_tokens=2)

    usage = await gateway.usage(key_id=key_id)
    assert usage["requests"] == 2
    assert usage["prompt_tokens"] == first.usage.input_tokens + follow.usage.input_tokens
    assert usage["completion_tokens"] == first.usage.output_tokens + follow.usage.output_tokens


async def test_a_streamed_response_sends_openais_events_in_order(backend_gateway: GatewayHarness) -> None:
    client = backend_gateway.client((await backend_gateway.key())[1], timeout=120)
    stream = await client.responses.create(model="smollm2", input="Count: one, two,", max_output_tokens=6,
                                           temperature=0, stream=True)
    events = [event async for event in stream]
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    final = events[-1].response  # type: ignore[union-attr]
    assert deltas and done.text == deltas and final.output_text == deltas
    assert final.usage is not None and final.usage.output_tokens > 0
    assert (await client.responses.retrieve(final.id)).output_text == deltas  # streamed responses are kept too


async def test_a_function_call_turn_and_its_output_continue_the_conversation(
        backend_url: str, gateway_for: Callable[..., Awaitable[GatewayHarness]]) -> None:
    # a tool call reaches the gateway whole, once its block is closed: slow shared cores get time for it
    gateway = await gateway_for([], channels=[{"name": "backend", "base_url": backend_url, "models": ["smollm2"],
                                               "timeouts": {"first_token": 90.0, "total": 120.0}}])
    client = gateway.client((await gateway.key())[1], timeout=120)
    call_turn = await client.responses.create(model="smollm2", input="What is the weather in Paris?",
                                              tools=[WEATHER], tool_choice="required",  # type: ignore[list-item]
                                              parallel_tool_calls=False, max_output_tokens=40, temperature=0)
    calls = [item for item in call_turn.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id
    assert isinstance(json.loads(calls[0].arguments)["city"], str)

    answer = await client.responses.create(model="smollm2", previous_response_id=call_turn.id,
                                           tools=[WEATHER],  # type: ignore[list-item]
                                           input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                                   "output": "sunny, 24 degrees"}], max_output_tokens=3,
                                           temperature=0)
    assert answer.output_text and answer.usage is not None and call_turn.usage is not None
    assert answer.usage.input_tokens > call_turn.usage.input_tokens
