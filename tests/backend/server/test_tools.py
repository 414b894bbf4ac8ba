"""Tool calls without a model: the prompt forms, calls parsed from output, and the stream's hold-back."""

from __future__ import annotations

import json
from typing import Any

import pytest

from backend.loading.chat_template import ChatTemplate
from backend.server.tool_stream import ForcedToolStream, ToolStream
from backend.server.tools import ToolRequest, parse_calls, prompt_messages, render_chat

WEATHER = {"name": "get_weather", "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}
TOOLS = ToolRequest([WEATHER])
CALL = '<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>'


def calls_of(found: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    return [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in found]


def test_blocks_of_known_functions_become_calls_and_the_rest_stays_content() -> None:
    content, calls = parse_calls(f"Let me check.\n{CALL}\n{CALL.replace('Paris', 'Rome')}", TOOLS)
    assert content == "Let me check."
    assert calls_of(calls) == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": "Rome"})]
    assert all(c["id"].startswith("call_") and c["type"] == "function" for c in calls)


@pytest.mark.parametrize(("text", "expected"), [
    ('{"name": "get_weather", "arguments": {"city": "Oslo"}}', [("get_weather", {"city": "Oslo"})]),
    ('<tool_call>{"name": "launch_rockets", "arguments": {}}</tool_call>', []),
    ("<tool_call>not json</tool_call>", []),
    ("The weather is fine.", []),
])
def test_only_calls_of_known_functions_with_object_arguments_count(text: str, expected: list[Any]) -> None:
    content, calls = parse_calls(text, TOOLS)
    assert calls_of(calls) == expected
    assert content == (None if expected else text)


def test_without_parallel_calls_only_the_first_is_kept_and_a_cut_call_is_dropped() -> None:
    single = ToolRequest([WEATHER], parallel=False)
    content, calls = parse_calls(f"{CALL}\n{CALL}\n<tool_call>{{\"name\": \"get_w", single)
    assert len(calls) == 1 and content is None


@pytest.mark.parametrize("chunks", [
    ["Sure", ". <tool", "_call>{\"name\": \"get_weather\", ", "\"arguments\": {\"city\": \"Paris\"}}</tool_call>"],
    ["{\"name\": \"get_weather\", \"arguments\": ", "{\"city\": \"Paris\"}}"],
    ["A <tool", " box is not a call."],
])
def test_a_stream_assembles_to_the_same_calls_as_the_whole_text(chunks: list[str]) -> None:
    stream = ToolStream(TOOLS)
    streamed = "".join(stream.push(c)[0] for c in chunks)
    held, calls, _ = stream.finish()
    whole_content, whole_calls = parse_calls("".join(chunks), TOOLS)
    assert calls_of(calls) == calls_of(whole_calls)
    assert (streamed + held).strip() == (whole_content or "").strip()
    assert "<tool" not in streamed or not calls  # nothing of a call leaks out as content


def _merged(deltas: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """Deltas folded the way the openai client folds them: by index, arguments concatenated."""
    calls: dict[int, dict[str, Any]] = {}
    for delta in deltas:
        call = calls.setdefault(delta["index"], {"name": None, "arguments": ""})
        call["name"] = delta["function"].get("name") or call["name"]
        call["arguments"] += delta["function"]["arguments"]
    return [(c["name"], json.loads(c["arguments"])) for c in calls.values()]


def test_a_forced_call_streams_its_name_first_then_argument_fragments_token_by_token() -> None:
    text = CALL + "\n" + CALL.replace("Paris", 'Ro\\"me}')
    stream = ForcedToolStream()
    deltas: list[dict[str, Any]] = []
    first_at = None
    for i, char in enumerate(text):  # one character a token: the hardest split
        content, out = stream.push(char)
        assert content == ""
        if out and first_at is None:
            first_at = i
        deltas += out
    assert first_at is not None and first_at < text.index("Paris")  # before any argument is generated
    head = deltas[0]
    assert head["id"].startswith("call_") and head["type"] == "function"
    assert head["function"] == {"name": "get_weather", "arguments": ""} and head["index"] == 0
    assert _merged(deltas) == [("get_weather", {"city": "Paris"}), ("get_weather", {"city": 'Ro"me}'})]
    first = "".join(d["function"]["arguments"] for d in deltas if d["index"] == 0)
    assert first == json.dumps({"city": "Paris"})  # spaced as the non-streamed answer re-encodes it


def test_forced_arguments_are_spaced_and_escaped_as_json_dumps_writes_them() -> None:
    stream = ForcedToolStream()
    _, deltas = stream.push('<tool_call>{"name": "get_weather", "arguments": {\n  "city" :"Zürich, CH",\n'
                            '  "days":[1,2]}}</tool_call>')
    arguments = "".join(d["function"]["arguments"] for d in deltas)
    assert arguments == json.dumps({"city": "Zürich, CH", "days": [1, 2]})
    assert stream.finish() == ("", [], True)


def test_the_generic_prompt_lists_tools_and_renders_calls_and_results_as_blocks() -> None:
    messages = [{"role": "user", "content": "Weather in Paris and Rome?"},
                {"role": "assistant", "content": "", "tool_calls": [{"name": "get_weather",
                                                                     "arguments": {"city": "Paris"}}]},
                {"role": "tool", "content": "Sunny", "tool_call_id": "call_1"},
                {"role": "tool", "content": "Rain", "tool_call_id": "call_2"}]
    rendered = prompt_messages(messages, TOOLS)
    assert [m["role"] for m in rendered] == ["system", "user", "assistant", "user"]
    assert '"name": "get_weather"' in rendered[0]["content"] and "<tools>" in rendered[0]["content"]
    assert rendered[2]["content"] == CALL
    assert rendered[3]["content"] == "<tool_response>\nSunny\n</tool_response>\n<tool_response>\nRain\n</tool_response>"


def test_a_template_with_a_tools_section_renders_the_tools_itself() -> None:
    class WithTemplate:
        chat_template = ChatTemplate("{% for t in tools %}[{{ t.function.name }}]{% endfor %}"
                                     "{% for m in messages %}{{ m.role }}:{{ m.content }}"
                                     "{% for c in m.tool_calls or [] %}<{{ c.function.arguments.city }}>{% endfor %}"
                                     "{% endfor %}")

    messages = [{"role": "user", "content": "hi"},
                {"role": "assistant", "content": "", "tool_calls": [{"name": "get_weather",
                                                                     "arguments": {"city": "Oslo"}}]}]
    assert render_chat(WithTemplate(), messages, TOOLS) == "[get_weather]user:hiassistant:<Oslo>"  # type: ignore[arg-type]
