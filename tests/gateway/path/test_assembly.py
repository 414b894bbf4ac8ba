"""Folding stream chunks into a whole answer: several choices, tool calls in pieces, logprobs, usage."""

from __future__ import annotations

from typing import Any

from gateway.path.assembly import Assembly

ENVELOPE = {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1700000000, "model": "private",
            "system_fingerprint": "fp_1"}


def chunk(*choices: dict[str, Any], usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {**ENVELOPE, "choices": list(choices), "usage": usage}


def token(text: str, logprob: float) -> dict[str, Any]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode()), "top_logprobs": []}


def test_two_choices_interleaved_come_out_whole_in_index_order_with_their_logprobs() -> None:
    assembly = Assembly(chat=True, model="public")
    for piece in (
        chunk({"index": 1, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None},
              {"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None, "finish_reason": None}),
        chunk({"index": 0, "delta": {"content": "Hel"}, "logprobs": {"content": [token("Hel", -0.1)]},
               "finish_reason": None}),
        chunk({"index": 1, "delta": {"content": "Bye"}, "logprobs": {"content": [token("Bye", -0.5)]},
               "finish_reason": "stop"}),
        chunk({"index": 0, "delta": {"content": "lo"}, "logprobs": {"content": [token("lo", -0.2)]},
               "finish_reason": "length"}),
        chunk(usage={"prompt_tokens": 5, "completion_tokens": 3, "total_tokens": 8,
                     "prompt_tokens_details": {"cached_tokens": 0}}),
    ):
        assembly.add(piece)
    answer = assembly.answer()
    assert list(answer) == ["id", "object", "created", "model", "choices", "usage", "system_fingerprint"]
    assert (answer["object"], answer["model"], answer["id"]) == ("chat.completion", "public", "chatcmpl-9")
    first, second = answer["choices"]
    assert first == {"index": 0, "message": {"role": "assistant", "content": "Hello"},
                     "logprobs": {"content": [token("Hel", -0.1), token("lo", -0.2)]}, "finish_reason": "length"}
    assert second["message"]["content"] == "Bye" and second["finish_reason"] == "stop"
    assert answer["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}


def test_tool_call_deltas_merge_into_whole_calls() -> None:
    assembly = Assembly(chat=True, model="public")
    calls = [
        {"index": 0, "id": "call_a", "type": "function", "function": {"name": "weather", "arguments": ""}},
        {"index": 0, "function": {"arguments": '{"city": '}},
        {"index": 1, "id": "call_b", "type": "function", "function": {"name": "time", "arguments": "{}"}},
        {"index": 0, "function": {"arguments": '"Oslo"}'}},
    ]
    assembly.add(chunk({"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}))
    for call in calls:
        assembly.add(chunk({"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": None}))
    assembly.add(chunk({"index": 0, "delta": {}, "finish_reason": "tool_calls"}))
    message = assembly.answer()["choices"][0]["message"]
    assert message == {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_a", "type": "function", "function": {"name": "weather", "arguments": '{"city": "Oslo"}'}},
        {"id": "call_b", "type": "function", "function": {"name": "time", "arguments": "{}"}},
    ]}


def test_completions_join_their_text_and_extend_each_logprobs_list() -> None:
    assembly = Assembly(chat=False, model="public")
    for text, offset in (("The", 0), (" sky", 3)):
        assembly.add({**ENVELOPE, "object": "text_completion", "choices": [
            {"index": 0, "text": text, "finish_reason": None, "stop_reason": None,
             "logprobs": {"tokens": [text], "token_logprobs": [-0.3], "top_logprobs": [{text: -0.3}],
                          "text_offset": [offset]}}]})
    assembly.add({**ENVELOPE, "object": "text_completion",
                  "choices": [{"index": 0, "text": "", "finish_reason": "length", "stop_reason": None}]})
    choice = assembly.answer()["choices"][0]
    assert choice == {"index": 0, "text": "The sky", "finish_reason": "length", "stop_reason": None,
                      "logprobs": {"tokens": ["The", " sky"], "token_logprobs": [-0.3, -0.3],
                                   "top_logprobs": [{"The": -0.3}, {" sky": -0.3}], "text_offset": [0, 3]}}
    assert assembly.answer()["object"] == "text_completion" and "usage" not in assembly.answer()


def test_fields_first_seen_in_a_later_chunk_are_kept_and_the_first_value_of_each_wins() -> None:
    assembly = Assembly(chat=True, model="public")
    bare = {"id": "chatcmpl-9", "object": "chat.completion.chunk", "created": 1, "model": "private"}
    assembly.add({**bare, "choices": [{"index": 0, "delta": {"role": "assistant", "content": "a"}}]})
    assembly.add({**bare, "created": 2, "system_fingerprint": "fp_2",
                  "choices": [{"index": 0, "delta": {"content": "b"}, "stop_reason": None}]})
    assembly.add({**bare, "system_fingerprint": "fp_3",
                  "choices": [{"index": 0, "delta": {"content": "c"}, "finish_reason": "stop", "stop_reason": 7}]})
    answer = assembly.answer()
    assert (answer["created"], answer["system_fingerprint"]) == (1, "fp_2")
    assert answer["choices"][0]["message"]["content"] == "abc"
    assert answer["choices"][0]["stop_reason"] == 7  # a later non-null value of an unknown choice field stands
