"""The Responses API's translation to and from chat completions, over recorded request/answer pairs: requests
(items, multi-part content, tools, formats), whole answers, streamed chunks as events, and the 400s."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.apis.responses.answer import ResponseFrame, answer_response
from gateway.apis.responses.events import ResponseEvents
from gateway.apis.responses.request import chat_body
from gateway.errors import ApiError

WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": True}
CHAT_WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}, "strict": True}}
IMAGE = "data:image/png;base64,iVBORw0KGgo="

REQUESTS: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("a string input with instructions and sampling",
     {"model": "m", "input": "Hi", "instructions": "Be brief.", "temperature": 0.2, "top_p": 0.9,
      "max_output_tokens": 16, "user": "u-1", "store": False, "metadata": {"run": "7"}},
     {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
      "temperature": 0.2, "top_p": 0.9, "max_tokens": 16, "user": "u-1"}),
    ("multi-part content: text parts joined, an image kept as image_url",
     {"model": "m", "input": [
         {"role": "developer", "content": [{"type": "input_text", "text": "Rules: "},
                                           {"type": "input_text", "text": "none."}]},
         {"type": "message", "role": "user", "content": [
             {"type": "input_text", "text": "What is this?"},
             {"type": "input_image", "image_url": IMAGE, "detail": "low"}]}]},
     {"model": "m", "messages": [
         {"role": "developer", "content": "Rules: none."},
         {"role": "user", "content": [{"type": "text", "text": "What is this?"},
                                      {"type": "image_url", "image_url": {"url": IMAGE, "detail": "low"}}]}]}),
    ("a function-call turn: calls join the assistant's message, outputs become tool messages",
     {"model": "m", "tools": [WEATHER_TOOL], "tool_choice": {"type": "function", "name": "get_weather"},
      "parallel_tool_calls": False, "input": [
          {"role": "user", "content": "Weather in Paris and Rome?"},
          {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
           "content": [{"type": "output_text", "text": "Checking.", "annotations": []}]},
          {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"},
          {"type": "function_call", "call_id": "call_2", "name": "get_weather", "arguments": "{\"city\":\"Rome\"}"},
          {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
          {"type": "function_call_output", "call_id": "call_2",
           "output": [{"type": "input_text", "text": "rain"}]}]},
     {"model": "m", "tools": [CHAT_WEATHER_TOOL], "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
      "parallel_tool_calls": False, "messages": [
          {"role": "user", "content": "Weather in Paris and Rome?"},
          {"role": "assistant", "content": "Checking.", "tool_calls": [
              {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}},
              {"id": "call_2", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\":\"Rome\"}"}}]},
          {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
          {"role": "tool", "tool_call_id": "call_2", "content": "rain"}]}),
    ("a call without a message before it opens an assistant message of its own; json_schema becomes response_format",
     {"model": "m", "stream": True, "tool_choice": "auto", "priority": "batch",
      "text": {"format": {"type": "json_schema", "name": "answer", "strict": True,
                          "schema": {"type": "object"}}},
      "input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"}]},
     {"model": "m", "stream": True, "tool_choice": "auto", "priority": "batch",
      "response_format": {"type": "json_schema", "json_schema": {"name": "answer", "schema": {"type": "object"},
                                                                 "strict": True}},
      "messages": [{"role": "assistant", "content": None, "tool_calls": [
          {"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]}),
    ("neutral values of fields with no chat equivalent are accepted",
     {"model": "m", "input": "Hi", "truncation": "disabled", "background": False, "include": [],
      "text": {"format": {"type": "text"}}, "reasoning": None},
     {"model": "m", "messages": [{"role": "user", "content": "Hi"}]}),
]


@pytest.mark.parametrize(("request_body", "chat"), [pytest.param(r, c, id=name) for name, r, c in REQUESTS])
def test_a_request_becomes_its_chat_completion_request(request_body: dict[str, Any], chat: dict[str, Any]) -> None:
    assert chat_body(request_body, [])[0] == chat


def test_a_previous_responses_items_come_before_the_new_input_and_are_kept_with_it() -> None:
    history = [{"type": "message", "role": "user", "content": "Hi"},
               {"id": "msg_1", "type": "message", "role": "assistant", "status": "completed",
                "content": [{"type": "output_text", "text": "Hello!", "annotations": [], "logprobs": []}]}]
    body, items = chat_body({"model": "m", "input": "Again?", "instructions": "New rules."}, history)
    assert body["messages"] == [{"role": "system", "content": "New rules."}, {"role": "user", "content": "Hi"},
                                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Again?"}]
    assert items == [*history, {"type": "message", "role": "user", "content": "Again?"}]  # instructions are not


REFUSED: list[tuple[dict[str, Any], str]] = [
    ({"tools": [{"type": "web_search_preview"}]}, "tools[0].type"),
    ({"tools": [WEATHER_TOOL, {"type": "file_search", "vector_store_ids": ["vs"]}]}, "tools[1].type"),
    ({"tool_choice": {"type": "web_search_preview"}}, "tool_choice"),
    ({"input": [{"type": "reasoning", "summary": []}]}, "input[0].type"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]},
     "input[0].content[0].file_id"),
    ({"input": [{"role": "user", "content": [{"type": "input_audio"}]}]}, "input[0].content[0]"),
    ({"input": [{"role": "tool", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": 7}, "input"),
    ({"input": []}, "input"),
    ({"reasoning": {"effort": "low"}}, "reasoning"),
    ({"truncation": "auto"}, "truncation"),
    ({"include": ["message.output_text.logprobs"]}, "include"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"text": {"format": {"type": "grammar"}}}, "text.format.type"),
    ({"instructions": ["a"]}, "instructions"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
]


@pytest.mark.parametrize(("extra", "param"), REFUSED, ids=[p for _, p in REFUSED])
def test_what_has_no_chat_equivalent_is_a_400_naming_the_field(extra: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as refused:
        chat_body({"model": "m", "input": "Hi", **extra}, [])
    assert (refused.value.status, refused.value.param) == (400, param)


def usage(prompt: int, completion: int, cached: int = 0) -> dict[str, Any]:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def frame(**request: Any) -> ResponseFrame:
    return ResponseFrame("m", {"model": "m", **request}, id="resp_1", created_at=1700000000)


def test_a_whole_answer_becomes_a_response_object() -> None:
    completion = {"id": "chatcmpl-1", "object": "chat.completion", "model": "m", "usage": usage(20, 9, cached=16),
                  "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                      "role": "assistant", "content": "Let me check.", "tool_calls": [
                          {"id": "call_9", "type": "function",
                           "function": {"name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}}]}}]}
    response = answer_response(frame(tools=[WEATHER_TOOL], temperature=0, previous_response_id="resp_0"), completion)
    message, call = response["output"]
    assert message["id"].startswith("msg_") and call["id"].startswith("fc_")
    assert {**message, "id": "msg"} == {"id": "msg", "type": "message", "status": "completed", "role": "assistant",
                                        "content": [{"type": "output_text", "text": "Let me check.",
                                                     "annotations": [], "logprobs": []}]}
    assert {**call, "id": "fc"} == {"id": "fc", "type": "function_call", "status": "completed", "call_id": "call_9",
                                    "name": "get_weather", "arguments": "{\"city\":\"Paris\"}"}
    assert {k: response[k] for k in ("id", "object", "created_at", "status", "error", "incomplete_details", "model",
                                     "tools", "temperature", "previous_response_id", "store", "usage")} == {
        "id": "resp_1", "object": "response", "created_at": 1700000000, "status": "completed", "error": None,
        "incomplete_details": None, "model": "m", "tools": [WEATHER_TOOL], "temperature": 0,
        "previous_response_id": "resp_0", "store": True,
        "usage": {"input_tokens": 20, "input_tokens_details": {"cached_tokens": 16}, "output_tokens": 9,
                  "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": 29}}


def test_an_answer_cut_by_length_is_incomplete() -> None:
    completion = {"choices": [{"index": 0, "finish_reason": "length",
                               "message": {"role": "assistant", "content": "One, two"}}], "usage": usage(5, 2)}
    response = answer_response(frame(max_output_tokens=2), completion)
    assert (response["status"], response["incomplete_details"]) == ("incomplete", {"reason": "max_output_tokens"})
    assert response["output"][0]["status"] == "incomplete" and response["max_output_tokens"] == 2


def chunk(delta: dict[str, Any] | None = None, finish: str | None = None, **extra: Any) -> dict[str, Any]:
    choices = [] if delta is None else [{"index": 0, "delta": delta, "finish_reason": finish}]
    return {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": "m", "choices": choices, **extra}


def streamed(chunks: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], ResponseEvents]:
    translator = ResponseEvents(frame())
    events = translator.start()
    for piece in chunks:
        events += translator.add(piece)
    return events + translator.finish(), translator


def test_streamed_text_becomes_openais_event_sequence() -> None:
    events, translator = streamed([chunk({"role": "assistant", "content": ""}), chunk({"content": "Hel"}),
                                   chunk({"content": "lo"}, "stop"), chunk(usage=usage(4, 2))])
    assert [(e["type"], e.get("delta") or e.get("text")) for e in events] == [
        ("response.created", None), ("response.in_progress", None), ("response.output_item.added", None),
        ("response.content_part.added", None), ("response.output_text.delta", "Hel"),
        ("response.output_text.delta", "lo"), ("response.output_text.done", "Hello"),
        ("response.content_part.done", None), ("response.output_item.done", None), ("response.completed", None)]
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    item_id = events[2]["item"]["id"]
    assert all(e["item_id"] == item_id and e["output_index"] == 0 for e in events[3:8])
    assert events[0]["response"]["status"] == "in_progress" and events[0]["response"]["output"] == []
    final = events[-1]["response"]
    assert final == translator.final and final["status"] == "completed"
    assert final["output"] == [{"id": item_id, "type": "message", "status": "completed", "role": "assistant",
                                "content": [{"type": "output_text", "text": "Hello", "annotations": [],
                                             "logprobs": []}]}]
    assert final["usage"]["input_tokens"] == 4 and final["usage"]["output_tokens"] == 2


def test_streamed_tool_calls_become_function_call_items_with_argument_deltas() -> None:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
    events, translator = streamed([
        chunk({"role": "assistant", "content": None, "tool_calls": [call]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "{\"city\":"}}]}),
        chunk({"tool_calls": [{"index": 0, "function": {"arguments": "\"Paris\"}"}}]}, "tool_calls")])
    assert [e["type"] for e in events[2:]] == [
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    added, done = events[2]["item"], events[-2]["item"]
    assert (added["type"], added["status"], added["call_id"], added["name"], added["arguments"]) == (
        "function_call", "in_progress", "call_1", "get_weather", "")
    assert events[5]["arguments"] == done["arguments"] == "{\"city\":\"Paris\"}" and done["status"] == "completed"
    assert translator.final is not None and translator.final["output"] == [done]


def test_a_stream_cut_by_length_ends_incomplete() -> None:
    events, _ = streamed([chunk({"content": "One"}, "length")])
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"]["incomplete_details"] == {"reason": "max_output_tokens"}


def test_a_failed_stream_ends_with_response_failed_then_an_error_event() -> None:
    translator = ResponseEvents(frame())
    translator.start()
    translator.add(chunk({"content": "partial"}))
    failed, error = translator.fail(ApiError(502, "the upstream broke off", "upstream_error", "stream_cut"))
    assert failed["type"] == "response.failed" and failed["response"]["status"] == "failed"
    assert failed["response"]["error"] == {"code": "stream_cut", "message": "the upstream broke off"}
    assert error["type"] == "error" and error["code"] == "stream_cut"
    assert error["error"]["message"] == "the upstream broke off"  # what the openai SDK raises APIError from
    assert error["sequence_number"] == failed["sequence_number"] + 1


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3),
                    max_leaves=12)
# values shaped like the real thing often enough to get past the first check
ITEM = st.fixed_dictionaries({"type": st.sampled_from(["message", "function_call", "function_call_output", "x"]),
                              "role": st.sampled_from(["user", "assistant", "tool"]) | JSON,
                              "content": st.lists(st.fixed_dictionaries({
                                  "type": st.sampled_from(["input_text", "input_image", "output_text"]),
                                  "text": JSON, "image_url": JSON}), max_size=2) | JSON,
                              "call_id": JSON, "name": JSON, "arguments": JSON, "output": JSON})
FIELDS = {"input": st.lists(ITEM, max_size=3) | JSON, "tools": st.lists(st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "web_search"]) | JSON, "name": JSON, "parameters": JSON}), max_size=2) | JSON,
    "tool_choice": JSON, "text": st.fixed_dictionaries({"format": JSON}) | JSON, "instructions": JSON,
    "max_output_tokens": JSON, "reasoning": JSON, "include": JSON}


@settings(max_examples=100, deadline=None, database=None, derandomize=True)
@given(st.fixed_dictionaries({}, optional=FIELDS))
def test_any_request_translates_or_is_a_400(fields: dict[str, Any]) -> None:
    try:
        body, _ = chat_body({"model": "m", "input": "Hi", **fields}, [])
    except ApiError as refused:
        assert refused.status == 400 and refused.param
    else:
        assert body["messages"] and json.dumps(body)


CHOICE = st.fixed_dictionaries({}, optional={
    "index": st.sampled_from([0, 1]) | JSON, "finish_reason": JSON, "message": JSON, "delta": st.fixed_dictionaries(
        {}, optional={"content": JSON, "refusal": JSON, "tool_calls": st.lists(st.fixed_dictionaries(
            {}, optional={"index": JSON, "id": JSON, "function": JSON}), max_size=2) | JSON}) | JSON})
ANSWER = st.fixed_dictionaries({}, optional={"choices": st.lists(CHOICE, max_size=2) | JSON, "usage": JSON})


@settings(max_examples=100, deadline=None, database=None, derandomize=True)
@given(st.lists(ANSWER, max_size=4))
def test_any_upstream_answer_translates_without_failing(answers: list[dict[str, Any]]) -> None:
    for answer in answers:
        assert answer_response(frame(), answer)["object"] == "response"
    events, translator = streamed(answers)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    assert translator.final is not None and json.dumps(translator.final)
