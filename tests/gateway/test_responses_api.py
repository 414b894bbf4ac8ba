"""The Responses API through a `tidegate gateway` process in front of a real backend, driven by the official
openai client: create, stream, a function-call turn, continuing with previous_response_id, usage charged."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.live_stack import ADMIN_KEY, LiveStack, live_stack

WEATHER = {"type": "function", "name": "get_weather", "description": "The weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 16}},
                          "required": ["city"],
                          "additionalProperties": False}}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, model_path: Path) -> Iterator[LiveStack]:
    # a tool call reaches the gateway whole, once its block is closed: give slow shared cores time for it
    timeouts = {"first_token": 90.0, "total": 120.0}
    with live_stack(tmp_path_factory.mktemp("responses-stack"), model_path, channel={"timeouts": timeouts}) as running:
        yield running


@pytest.fixture(scope="module")
def admin(stack: LiveStack) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=stack.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=30) as client:
        yield client


def new_key(admin: httpx.Client) -> tuple[str, str]:
    """(key id, secret) of a key of a new account."""
    account = admin.post("/admin/accounts", json={"name": "responses"}).json()["id"]
    created = admin.post("/admin/keys", json={"account_id": account}).json()
    return created["id"], created["key"]


def test_a_response_is_stored_and_continued_only_by_its_account(stack: LiveStack, admin: httpx.Client) -> None:
    key_id, secret = new_key(admin)
    client = stack.client(secret)
    first = client.responses.create(model="smollm2", instructions="Answer in one short sentence.",
                                    input="What colour is the sky?", max_output_tokens=8, temperature=0)
    assert first.object == "response" and first.id.startswith("resp_")
    assert first.status in ("completed", "incomplete") and first.output_text
    assert first.output[0].type == "message" and first.output[0].role == "assistant"
    assert first.usage is not None and first.usage.input_tokens > 0
    assert first.usage.total_tokens == first.usage.input_tokens + first.usage.output_tokens
    assert client.responses.retrieve(first.id).output_text == first.output_text

    follow = client.responses.create(model="smollm2", previous_response_id=first.id, input="And at night?",
                                     max_output_tokens=4, temperature=0)
    assert follow.previous_response_id == first.id and follow.output_text
    assert follow.usage is not None
    # the earlier turn (its question and answer) was sent again, the instructions were not
    assert follow.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens - 16

    other = stack.client(new_key(admin)[1])
    with pytest.raises(openai.NotFoundError):
        other.responses.retrieve(first.id)
    with pytest.raises(openai.NotFoundError):
        other.responses.create(model="smollm2", previous_response_id=first.id, input="Hi", max_output_tokens=2)

    usage = admin.get("/admin/usage", params={"key_id": key_id}).json()
    assert usage["requests"] == 2
    assert usage["prompt_tokens"] == first.usage.input_tokens + follow.usage.input_tokens
    assert usage["completion_tokens"] == first.usage.output_tokens + follow.usage.output_tokens


def test_a_streamed_response_sends_openais_events_in_order(stack: LiveStack, admin: httpx.Client) -> None:
    client = stack.client(new_key(admin)[1])
    events = list(client.responses.create(model="smollm2", input="Count: one, two,", max_output_tokens=6,
                                          temperature=0, stream=True))
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
    assert client.responses.retrieve(final.id).output_text == deltas  # streamed responses are stored too


def test_a_function_call_turn_and_its_output_continue_the_conversation(stack: LiveStack,
                                                                        admin: httpx.Client) -> None:
    client = stack.client(new_key(admin)[1])
    call_turn = client.responses.create(model="smollm2", input="What is the weather in Paris?", tools=[WEATHER],  # type: ignore[list-item]
                                        tool_choice="required", parallel_tool_calls=False, max_output_tokens=40,
                                        temperature=0)
    calls = [item for item in call_turn.output if item.type == "function_call"]
    assert calls and calls[0].name == "get_weather" and calls[0].call_id
    assert isinstance(json.loads(calls[0].arguments)["city"], str)

    answer = client.responses.create(model="smollm2", previous_response_id=call_turn.id, tools=[WEATHER],  # type: ignore[list-item]
                                     input=[{"type": "function_call_output", "call_id": calls[0].call_id,
                                             "output": "sunny, 24 degrees"}], max_output_tokens=6, temperature=0)
    assert answer.output_text and answer.usage is not None
    assert answer.usage.input_tokens > call_turn.usage.input_tokens  # type: ignore[union-attr]


def test_store_false_is_not_kept(stack: LiveStack, admin: httpx.Client) -> None:
    client = stack.client(new_key(admin)[1])
    unstored = client.responses.create(model="smollm2", input="Hi", max_output_tokens=2, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    with pytest.raises(openai.NotFoundError) as refused:
        client.responses.create(model="smollm2", previous_response_id=unstored.id, input="Hi", max_output_tokens=2)
    assert refused.value.body["param"] == "previous_response_id"  # type: ignore[index]


@pytest.mark.parametrize(("extra", "param"), [
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"reasoning": {"effort": "high"}}, "reasoning"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "file-1"}]}]}, "input[0].content[0]"),
    ({"background": True}, "background"),
])
def test_what_cannot_be_translated_is_a_400_naming_the_field(stack: LiveStack, admin: httpx.Client,
                                                              extra: dict[str, Any], param: str) -> None:
    client = stack.client(new_key(admin)[1])
    body: dict[str, Any] = {"model": "smollm2", "input": "Hi", "max_output_tokens": 2, **extra}
    with pytest.raises(openai.BadRequestError) as refused:
        client.responses.create(**body)
    assert refused.value.body["param"] == param  # type: ignore[index]
