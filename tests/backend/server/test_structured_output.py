"""Structured output and tool calls through the official `openai` client against one real backend."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import jsonschema
import openai
import pytest

from tests.backend.backend_process import BackendProcess

MODEL = "smollm2"
SCHEMAS: list[dict[str, Any]] = [
    {"type": "object", "properties": {"name": {"type": "string", "maxLength": 16},
                                      "age": {"type": "integer", "minimum": 0, "maximum": 120}},
     "required": ["name", "age"], "additionalProperties": False},
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16},
                                      "sunny": {"type": "boolean"}},
     "required": ["city", "sunny"], "additionalProperties": False},
    {"type": "object", "properties": {"colors": {"type": "array", "items": {"enum": ["red", "green", "blue"]},
                                                 "minItems": 1, "maxItems": 3}},
     "required": ["colors"], "additionalProperties": False},
    {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]},
                                      "confidence": {"type": "integer", "minimum": 1, "maximum": 5}},
     "required": ["answer", "confidence"], "additionalProperties": False},
]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The current weather of a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                   "required": ["city"], "additionalProperties": False}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time in a timezone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 16}},
                   "required": ["timezone"], "additionalProperties": False}}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def backend(shared_backend: BackendProcess) -> BackendProcess:
    return shared_backend


@pytest.fixture(scope="module")
def client(backend: BackendProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=backend.base_url, api_key="unused", timeout=120.0, max_retries=0)


def run_concurrently(backend: BackendProcess, requests: list[dict[str, Any]]) -> list[Any]:
    """Send all requests at once, so the engine batches them (one by one would take minutes on this CPU)."""

    async def send() -> list[Any]:
        async with openai.AsyncOpenAI(base_url=backend.base_url, api_key="unused", timeout=180.0,
                                      max_retries=0) as aclient:
            return await asyncio.gather(*(aclient.chat.completions.create(model=MODEL, **r) for r in requests))

    return asyncio.run(send())


def test_twenty_json_schema_requests_over_four_schemas_all_validate(backend: BackendProcess) -> None:
    prompts = ["Describe a person.", "Tell me about the weather.", "Pick some colors.", "Is water wet?",
               "Answer in JSON."]
    requests = [{"messages": [{"role": "user", "content": prompts[i % 5]}], "max_tokens": 96, "temperature": 0.8,
                 "seed": i, "response_format": {"type": "json_schema", "json_schema": {
                     "name": f"schema{i % 4}", "schema": SCHEMAS[i % 4], "strict": True}}}
                for i in range(20)]
    for i, answer in enumerate(run_concurrently(backend, requests)):
        choice = answer.choices[0]
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), SCHEMAS[i % 4])


def test_json_object_returns_a_json_object(client: openai.OpenAI) -> None:
    answer = client.chat.completions.create(
        model=MODEL, max_tokens=48, temperature=0, response_format={"type": "json_object"},
        messages=[{"role": "user", "content": 'Give a JSON object with one key, "city", holding a capital.'}])
    assert answer.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(answer.choices[0].message.content or ""), dict)


def test_regex_and_choice_extras_hold(backend: BackendProcess) -> None:
    question = [{"role": "user", "content": "Is the sky blue? And what is a phone number?"}]
    regex, choice, guided = run_concurrently(backend, [
        {"messages": question, "max_tokens": 16, "temperature": 1.0, "seed": 3,
         "extra_body": {"structured_outputs": {"regex": "[0-9]{3}-[0-9]{4}"}}},
        {"messages": question, "max_tokens": 16, "temperature": 1.0, "seed": 4,
         "extra_body": {"structured_outputs": {"choice": ["yes", "no", "maybe"]}}},
        {"messages": question, "max_tokens": 16, "temperature": 1.0, "seed": 5,
         "extra_body": {"guided_choice": ["left", "right"]}},
    ])
    text = regex.choices[0].message.content
    assert len(text) == 8 and text[3] == "-" and (text[:3] + text[4:]).isdigit()
    assert choice.choices[0].message.content in ("yes", "no", "maybe")
    assert guided.choices[0].message.content in ("left", "right")


@pytest.mark.parametrize(("extra", "param"), [
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "bad", "schema": {"type": "bogus"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "bad", "schema": {
        "type": "object", "properties": {"a": {"not": {"type": "string"}}}}}}},
     "response_format.json_schema.schema.properties.a.not"),
    ({"extra_body": {"guided_regex": "(unclosed"}}, "guided_regex"),
    ({"tools": [WEATHER] * 65}, "tools"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
])
def test_a_constraint_that_cannot_be_enforced_is_a_400_naming_the_field(
        client: openai.OpenAI, extra: dict[str, Any], param: str) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        client.chat.completions.create(model=MODEL, max_tokens=4, messages=ASK_WEATHER, **extra)
    assert caught.value.body["param"] == param  # type: ignore[index]


def test_tool_choice_required_always_returns_calls_whose_arguments_validate(backend: BackendProcess) -> None:
    asks = ["What is the weather in Paris?", "What time is it in Tokyo?", "Weather in Rome, please.",
            "Is it raining in Oslo?"]
    answers = run_concurrently(backend, [
        # 48 tokens hold one whole call of either function (16 characters of argument at most)
        {"messages": [{"role": "user", "content": ask}], "max_tokens": 48, "temperature": 0.7, "seed": i,
         "tools": [WEATHER, TIME], "tool_choice": "required", "parallel_tool_calls": i % 2 == 0}
        for i, ask in enumerate(asks)])
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in (WEATHER, TIME)}
    for answer in answers:
        calls = answer.choices[0].message.tool_calls
        assert calls, answer.choices[0]
        for call in calls:
            assert call.id.startswith("call_") and call.type == "function"
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])


def test_streamed_tool_calls_assemble_to_the_non_streamed_ones(client: openai.OpenAI) -> None:
    request: dict[str, Any] = {"model": MODEL, "messages": ASK_WEATHER, "max_tokens": 48, "temperature": 0,
                               "tools": [WEATHER], "parallel_tool_calls": False,
                               "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}
    whole = client.chat.completions.create(**request).choices[0]
    assembled: dict[int, dict[str, str]] = {}
    finish = None
    for chunk in client.chat.completions.create(**request, stream=True):
        for delta in chunk.choices[0].delta.tool_calls or []:
            call = assembled.setdefault(delta.index, {"id": "", "name": "", "arguments": ""})
            call["id"] += delta.id or ""
            call["name"] += delta.function.name or "" if delta.function else ""
            call["arguments"] += delta.function.arguments or "" if delta.function else ""
        finish = chunk.choices[0].finish_reason or finish
    assert whole.finish_reason == finish == "tool_calls"
    assert [(c["name"], c["arguments"]) for c in assembled.values()] == [
        (c.function.name, c.function.arguments) for c in whole.message.tool_calls or []]
    assert all(c["id"].startswith("call_") for c in assembled.values())


def test_a_forced_tool_call_streams_its_name_first_then_its_arguments_as_they_are_generated(
        client: openai.OpenAI) -> None:
    """Issue 41: a call held until complete sent no first token, so the gateway timed it out as a channel fault."""
    stream = client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, max_tokens=48, temperature=0,
                                            tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
                                            stream=True)
    deltas = [d for chunk in stream if chunk.choices for d in chunk.choices[0].delta.tool_calls or []]
    head, fragments = deltas[0], deltas[1:]
    assert head.id and head.id.startswith("call_") and head.type == "function" and head.function is not None
    assert (head.function.name, head.function.arguments) == ("get_weather", "")
    assert len(fragments) > 1 and all(d.id is None and d.function and d.function.arguments for d in fragments)
    arguments = json.loads("".join(d.function.arguments or "" for d in fragments if d.function))
    jsonschema.validate(arguments, WEATHER["function"]["parameters"])  # type: ignore[index]


def test_a_two_turn_tool_conversation_answers_from_the_tool_result(client: openai.OpenAI) -> None:
    first = client.chat.completions.create(model=MODEL, messages=ASK_WEATHER, max_tokens=48, temperature=0,
                                           tools=[WEATHER], tool_choice="required", parallel_tool_calls=False)
    message = first.choices[0].message
    assert first.choices[0].finish_reason == "tool_calls" and message.tool_calls
    call = message.tool_calls[0]
    second = client.chat.completions.create(
        model=MODEL, max_tokens=32, temperature=0, tools=[WEATHER],
        messages=[*ASK_WEATHER, {"role": "assistant", "content": None,
                                 "tool_calls": [call.model_dump()]},  # type: ignore[list-item]
                  {"role": "tool", "tool_call_id": call.id, "content": "Sunny, 24 degrees Celsius"}])
    answer = second.choices[0]
    assert answer.message.content and answer.finish_reason in ("stop", "length")
