"""Response bodies in exactly OpenAI's shapes, for both endpoints, whole and streamed."""

from __future__ import annotations

from backend.server.protocol import Endpoint
from backend.server.responses import ResponseBuilder, usage


def test_usage_counts_total_and_cached_tokens() -> None:
    assert usage(10, 4, 8) == {"prompt_tokens": 10, "completion_tokens": 4, "total_tokens": 14,
                               "prompt_tokens_details": {"cached_tokens": 8}}


def test_chat_response_and_chunks_share_one_id_and_created() -> None:
    b = ResponseBuilder(Endpoint.CHAT, "abc", "smollm2", include_usage=True, created=7)
    whole = b.response("Hi", "stop", usage(1, 1, 0))
    assert whole["id"] == "chatcmpl-abc" and whole["object"] == "chat.completion" and whole["created"] == 7
    assert whole["choices"] == [{"index": 0, "message": {"role": "assistant", "content": "Hi"},
                                 "logprobs": None, "finish_reason": "stop"}]
    role = b.role_chunk()
    assert role is not None and role["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    text = b.text_chunk("Hi")
    assert text["object"] == "chat.completion.chunk" and text["usage"] is None
    assert text["choices"][0]["delta"] == {"content": "Hi"} and text["choices"][0]["finish_reason"] is None
    assert b.text_chunk("", "length")["choices"][0]["delta"] == {}
    last = b.usage_chunk(usage(1, 1, 0))
    assert last["choices"] == [] and last["usage"]["total_tokens"] == 2 and last["id"] == "chatcmpl-abc"


def test_completion_chunks_carry_text_and_no_usage_key_without_include_usage() -> None:
    b = ResponseBuilder(Endpoint.COMPLETION, "abc", "smollm2")
    assert b.role_chunk() is None
    chunk = b.text_chunk(" Paris", None)
    assert chunk["id"] == "cmpl-abc" and chunk["object"] == "text_completion" and "usage" not in chunk
    assert chunk["choices"] == [{"index": 0, "text": " Paris", "logprobs": None, "finish_reason": None}]
    assert b.response(" Paris", "length", usage(3, 1, 0))["choices"][0]["text"] == " Paris"
