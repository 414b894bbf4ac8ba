"""Anthropic Messages <-> OpenAI chat, over recorded request, answer and stream pairs, in both directions."""

from __future__ import annotations

from typing import Any

import pytest

from gateway.anthropic_wire import (
    ChatChunks,
    MessagesEvents,
    chat_answer,
    chat_error,
    chat_request,
    messages_answer,
    messages_error,
    messages_request,
)
from gateway.errors import ApiError

PNG = "iVBORw0KGgo="
WEATHER_SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
MESSAGES_TOOL = {"name": "get_weather", "description": "Weather now", "input_schema": WEATHER_SCHEMA}
CHAT_TOOL = {"type": "function",
             "function": {"name": "get_weather", "parameters": WEATHER_SCHEMA, "description": "Weather now"}}

# (name, Messages request, the chat request it becomes)
MESSAGES_TO_CHAT: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("text and sampling",
     {"model": "m", "max_tokens": 50, "system": "Be brief.", "messages": [{"role": "user", "content": "Hi"}],
      "stop_sequences": ["\n\n"], "temperature": 0.2, "top_p": 0.9, "top_k": 40, "stream": True,
      "metadata": {"user_id": "u-1"}},
     {"model": "m", "max_tokens": 50, "stream": True, "temperature": 0.2, "top_p": 0.9, "top_k": 40,
      "messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
      "stop": ["\n\n"], "user": "u-1"}),
    ("system blocks and multi-part content with images",
     {"model": "m", "max_tokens": 8,
      "system": [{"type": "text", "text": "You see.", "cache_control": {"type": "ephemeral"}},
                 {"type": "text", "text": " Answer."}],
      "messages": [{"role": "user", "content": [
          {"type": "text", "text": "What is this?"},
          {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}},
          {"type": "image", "source": {"type": "url", "url": "https://example.com/cat.jpg"}}]}]},
     {"model": "m", "max_tokens": 8, "messages": [
         {"role": "system", "content": "You see. Answer."},
         {"role": "user", "content": [
             {"type": "text", "text": "What is this?"},
             {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}},
             {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}}]}]}),
    ("a tool-use turn and its results",
     {"model": "m", "max_tokens": 64, "tools": [MESSAGES_TOOL],
      "tool_choice": {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
      "messages": [
          {"role": "user", "content": "Weather in Paris and Rome?"},
          {"role": "assistant", "content": [
              {"type": "text", "text": "Looking."},
              {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}},
              {"type": "tool_use", "id": "toolu_2", "name": "get_weather", "input": {"city": "Rome"}}]},
          {"role": "user", "content": [
              {"type": "tool_result", "tool_use_id": "toolu_1", "content": "18C"},
              {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": True,
               "content": [{"type": "text", "text": "no station"}]},
              {"type": "text", "text": "Thanks"}]}]},
     {"model": "m", "max_tokens": 64,
      "tools": [CHAT_TOOL],
      "tool_choice": {"type": "function", "function": {"name": "get_weather"}}, "parallel_tool_calls": False,
      "messages": [
          {"role": "user", "content": "Weather in Paris and Rome?"},
          {"role": "assistant", "content": "Looking.", "tool_calls": [
              {"id": "toolu_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
              {"id": "toolu_2", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'}}]},
          {"role": "tool", "tool_call_id": "toolu_1", "content": "18C"},
          {"role": "tool", "tool_call_id": "toolu_2", "content": "Error: no station"},
          {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}]}),
]

# (name, chat request, the Messages request it becomes)
CHAT_TO_MESSAGES: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
    ("text, leading system turns, stop string, no max_tokens",
     {"model": "m", "messages": [{"role": "system", "content": "Be brief."}, {"role": "developer", "content": "No lists."},
                                 {"role": "user", "content": "Hi"}],
      "stop": "END", "temperature": 0.5, "user": "u-1", "stream": True, "stream_options": {"include_usage": True}},
     {"model": "m", "temperature": 0.5, "stream": True, "max_tokens": 4096, "system": "Be brief.\n\nNo lists.",
      "messages": [{"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
      "stop_sequences": ["END"], "metadata": {"user_id": "u-1"}}),
    ("multi-part content, tool calls, tool results merged into one user turn",
     {"model": "m", "max_completion_tokens": 30, "tools": [CHAT_TOOL], "tool_choice": "required",
      "parallel_tool_calls": False, "n": 1,
      "messages": [
          {"role": "user", "content": [{"type": "text", "text": "Weather?"},
                                       {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{PNG}"}}]},
          {"role": "assistant", "content": None, "tool_calls": [
              {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city":"Oslo"}'}}]},
          {"role": "tool", "tool_call_id": "call_1", "content": "2C"},
          {"role": "user", "content": "And tomorrow?"}]},
     {"model": "m", "max_tokens": 30, "tools": [MESSAGES_TOOL],
      "tool_choice": {"type": "any", "disable_parallel_tool_use": True},
      "messages": [
          {"role": "user", "content": [
              {"type": "text", "text": "Weather?"},
              {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG}}]},
          {"role": "assistant", "content": [
              {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Oslo"}}]},
          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1", "content": "2C"},
                                       {"type": "text", "text": "And tomorrow?"}]}]}),
]

USER_HI = [{"role": "user", "content": "Hi"}]
# (what cannot be translated, the Messages request, the field the 400 names)
MESSAGES_REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("max_tokens missing", {"model": "m", "messages": USER_HI}, "max_tokens"),
    ("extended thinking", {"model": "m", "max_tokens": 9, "messages": USER_HI, "thinking": {"type": "enabled"}},
     "thinking"),
    ("a thinking block", {"model": "m", "max_tokens": 9, "messages": [
        {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm", "signature": "s"}]}]},
     "messages[0].content[0].type"),
    ("a document block", {"model": "m", "max_tokens": 9, "messages": [
        {"role": "user", "content": [{"type": "text", "text": "Read"}, {"type": "document", "source": {}}]}]},
     "messages[0].content[1].type"),
    ("an image from a file id", {"model": "m", "max_tokens": 9, "messages": [
        {"role": "user", "content": [{"type": "image", "source": {"type": "file", "file_id": "f"}}]}]},
     "messages[0].content[0].source"),
    ("a server tool", {"model": "m", "max_tokens": 9, "messages": USER_HI,
                       "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0].type"),
    ("metadata beyond user_id", {"model": "m", "max_tokens": 9, "messages": USER_HI, "metadata": {"team": "a"}},
     "metadata.team"),
    ("an image in a tool result", {"model": "m", "max_tokens": 9, "messages": [{"role": "user", "content": [
        {"type": "tool_result", "tool_use_id": "t", "content": [{"type": "image", "source": {}}]}]}]},
     "messages[0].content[0].content[0]"),
]
# (what cannot be translated, the chat request, the field the 400 names)
CHAT_REFUSED: list[tuple[str, dict[str, Any], str]] = [
    ("logprobs", {"model": "m", "messages": USER_HI, "logprobs": True}, "logprobs"),
    ("several choices", {"model": "m", "messages": USER_HI, "n": 2}, "n"),
    ("a response format", {"model": "m", "messages": USER_HI, "response_format": {"type": "json_object"}},
     "response_format"),
    ("a system turn mid-conversation", {"model": "m", "messages": [*USER_HI, {"role": "system", "content": "x"}]},
     "messages[1].role"),
    ("an audio part", {"model": "m", "messages": [{"role": "user", "content": [{"type": "input_audio"}]}]},
     "messages[0].content[0].type"),
    ("tool arguments that are not an object", {"model": "m", "messages": [{"role": "assistant", "tool_calls": [
        {"id": "c", "type": "function", "function": {"name": "f", "arguments": "[1]"}}]}]},
     "messages[0].tool_calls[0].function.arguments"),
]

CHAT_ANSWER = {
    "id": "chatcmpl-abc", "object": "chat.completion", "created": 1, "model": "m",
    "choices": [{"index": 0, "logprobs": None, "finish_reason": "tool_calls", "message": {
        "role": "assistant", "content": "Checking.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}]}}],
    "usage": {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42,
              "prompt_tokens_details": {"cached_tokens": 16}},
}
MESSAGES_ANSWER = {
    "id": "msg_abc", "type": "message", "role": "assistant", "model": "m",
    "content": [{"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Oslo"}}],
    "stop_reason": "tool_use", "stop_sequence": None,
    "usage": {"input_tokens": 14, "output_tokens": 12, "cache_creation_input_tokens": 0,
              "cache_read_input_tokens": 16},
}


def _chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
    return {"id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 1, "model": "m",
            "choices": [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]}


CHAT_CHUNKS = [
    _chunk({"role": "assistant", "content": ""}),
    _chunk({"content": "Check"}), _chunk({"content": "ing."}),
    _chunk({"tool_calls": [{"index": 0, "id": "call_1", "type": "function",
                            "function": {"name": "get_weather", "arguments": ""}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '{"city": '}}]}),
    _chunk({"tool_calls": [{"index": 0, "function": {"arguments": '"Oslo"}'}}]}),
    _chunk({}, "tool_calls"),
    {"id": "chatcmpl-abc", "object": "chat.completion.chunk", "created": 1, "model": "m", "choices": [],
     "usage": CHAT_ANSWER["usage"]},
]
MESSAGES_EVENTS: list[tuple[str, dict[str, Any]]] = [
    ("message_start", {"type": "message_start", "message": {
        "id": "msg_abc", "type": "message", "role": "assistant", "model": "m", "content": [], "stop_reason": None,
        "stop_sequence": None, "usage": {"input_tokens": 30, "output_tokens": 0}}}),
    ("ping", {"type": "ping"}),
    ("content_block_start", {"type": "content_block_start", "index": 0,
                             "content_block": {"type": "text", "text": ""}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 0,
                             "delta": {"type": "text_delta", "text": "Check"}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 0,
                             "delta": {"type": "text_delta", "text": "ing."}}),
    ("content_block_stop", {"type": "content_block_stop", "index": 0}),
    ("content_block_start", {"type": "content_block_start", "index": 1, "content_block": {
        "type": "tool_use", "id": "call_1", "name": "get_weather", "input": {}}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 1,
                             "delta": {"type": "input_json_delta", "partial_json": '{"city": '}}),
    ("content_block_delta", {"type": "content_block_delta", "index": 1,
                             "delta": {"type": "input_json_delta", "partial_json": '"Oslo"}'}}),
    ("content_block_stop", {"type": "content_block_stop", "index": 1}),
    ("message_delta", {"type": "message_delta", "delta": {"stop_reason": "tool_use", "stop_sequence": None},
                       "usage": MESSAGES_ANSWER["usage"]}),
    ("message_stop", {"type": "message_stop"}),
]


@pytest.mark.parametrize(("name", "messages", "chat"), MESSAGES_TO_CHAT, ids=[c[0] for c in MESSAGES_TO_CHAT])
def test_a_messages_request_becomes_its_chat_request(name: str, messages: dict[str, Any],
                                                     chat: dict[str, Any]) -> None:
    assert chat_request(messages) == chat


@pytest.mark.parametrize(("name", "chat", "messages"), CHAT_TO_MESSAGES, ids=[c[0] for c in CHAT_TO_MESSAGES])
def test_a_chat_request_becomes_its_messages_request(name: str, chat: dict[str, Any],
                                                     messages: dict[str, Any]) -> None:
    assert messages_request(chat, default_max_tokens=4096) == messages


@pytest.mark.parametrize(("name", "body", "param"), MESSAGES_REFUSED, ids=[c[0] for c in MESSAGES_REFUSED])
def test_what_chat_cannot_carry_is_a_400_naming_the_field(name: str, body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as refused:
        chat_request(body)
    assert (refused.value.status, refused.value.param) == (400, param)


@pytest.mark.parametrize(("name", "body", "param"), CHAT_REFUSED, ids=[c[0] for c in CHAT_REFUSED])
def test_what_messages_cannot_carry_is_a_400_naming_the_field(name: str, body: dict[str, Any], param: str) -> None:
    with pytest.raises(ApiError) as refused:
        messages_request(body, default_max_tokens=16)
    assert (refused.value.status, refused.value.param) == (400, param)


def test_whole_answers_translate_both_ways_with_tools_and_cached_usage() -> None:
    assert messages_answer(CHAT_ANSWER) == MESSAGES_ANSWER
    back = chat_answer(MESSAGES_ANSWER)
    assert back["created"] > 0
    assert {**back, "created": 1} == {**CHAT_ANSWER, "usage": {**CHAT_ANSWER["usage"]}}


def test_chat_chunks_become_the_messages_events_of_the_same_answer() -> None:
    stream = MessagesEvents("m", input_tokens=30)
    events = [e for chunk in CHAT_CHUNKS for e in stream.add(chunk)] + stream.finish()
    assert events == MESSAGES_EVENTS


def test_messages_events_become_the_chat_chunks_of_the_same_answer() -> None:
    chunks = ChatChunks()
    out = [c for _, data in MESSAGES_EVENTS for c in chunks.add(data)]
    expected = [{**c, "created": out[0]["created"]} for c in CHAT_CHUNKS]
    expected[-1]["usage"] = {"prompt_tokens": 30, "completion_tokens": 12, "total_tokens": 42,
                             "prompt_tokens_details": {"cached_tokens": 16}}
    assert out == expected


def test_errors_take_the_other_sides_shape() -> None:
    assert messages_error(ApiError(429, "slow down")) == {
        "type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    assert messages_error(ApiError(503, "busy"))["error"]["type"] == "overloaded_error"
    assert messages_error(ApiError(502, "broken"))["error"]["type"] == "api_error"
    assert chat_error({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}}) == {
        "error": {"message": "bad", "type": "invalid_request_error", "param": None, "code": None}}
