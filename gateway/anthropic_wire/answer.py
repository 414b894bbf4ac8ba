"""Whole answers and errors: a chat completion as a Messages answer (`messages_answer`), and back (`chat_answer`)."""

from __future__ import annotations

import json
import time
from typing import Any

from gateway.anthropic_wire.content import FINISH_REASONS, STOP_REASONS, arguments_of
from gateway.errors import ApiError

# Anthropic's error `type` for each status its SDK maps to an exception class
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
               403: "permission_error", 404: "not_found_error", 413: "request_too_large",
               429: "rate_limit_error", 503: "overloaded_error", 504: "timeout_error", 529: "overloaded_error"}


def messages_usage(usage: dict[str, Any] | None) -> dict[str, int]:
    """Chat usage as Messages usage, whose `input_tokens` leave out the tokens read from the prompt cache."""
    usage = usage or {}
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens") if isinstance(details, dict) else None)
    prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    return {"input_tokens": max(prompt - cached, 0), "output_tokens": completion,
            "cache_creation_input_tokens": 0, "cache_read_input_tokens": cached}


def chat_usage(usage: dict[str, Any] | None) -> dict[str, Any]:
    """Messages usage as chat usage: every input token is a prompt token, cache reads are its cached ones."""
    usage = usage or {}
    counts = {name: _count(value) for name, value in usage.items()}
    cached = counts.get("cache_read_input_tokens", 0)
    prompt = counts.get("input_tokens", 0) + cached + counts.get("cache_creation_input_tokens", 0)
    completion = counts.get("output_tokens", 0)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def stop_of(choice: dict[str, Any]) -> tuple[str | None, str | None]:
    """A chat choice's end as Messages' (`stop_reason`, `stop_sequence`); vLLM-style upstreams name the stop
    string that ended the choice in `stop_reason`."""
    finish = choice.get("finish_reason")
    matched = choice.get("stop_reason")
    if finish == "stop" and isinstance(matched, str):
        return "stop_sequence", matched
    return (STOP_REASONS.get(finish, "end_turn") if finish is not None else None), None


def messages_answer(chat: dict[str, Any]) -> dict[str, Any]:
    """A whole chat completion (one choice) as a Messages answer."""
    choices = chat.get("choices")
    first = choices[0] if isinstance(choices, list) and choices else None
    choice: dict[str, Any] = first if isinstance(first, dict) else {}
    message: dict[str, Any] = choice["message"] if isinstance(choice.get("message"), dict) else {}
    content: list[dict[str, Any]] = []
    if isinstance(message.get("content"), str) and message["content"]:
        content.append({"type": "text", "text": message["content"]})
    calls: list[Any] = message["tool_calls"] if isinstance(message.get("tool_calls"), list) else []
    for j, call in enumerate(c for c in calls if isinstance(c, dict)):
        content.append({"type": "tool_use", "id": str(call.get("id") or f"toolu_{j}"),
                        "name": (call.get("function") or {}).get("name"), "input": arguments_of(call, f"tool_calls[{j}]")})
    stop_reason, stop_sequence = stop_of(choice)
    return {"id": message_id(chat.get("id")), "type": "message", "role": "assistant", "model": chat.get("model"),
            "content": content, "stop_reason": stop_reason, "stop_sequence": stop_sequence,
            "usage": messages_usage(chat.get("usage"))}


def message_id(chat_id: Any) -> str:
    return "msg_" + str(chat_id or "tidegate").removeprefix("chatcmpl-")


def chat_answer(message: dict[str, Any]) -> dict[str, Any]:
    """A whole Messages answer as a chat completion."""
    texts, calls = [], []
    blocks: list[Any] = message["content"] if isinstance(message.get("content"), list) else []
    for block in (b for b in blocks if isinstance(b, dict)):
        if block.get("type") == "text":
            texts.append(block.get("text") or "")
        elif block.get("type") == "tool_use":
            calls.append({"id": block.get("id"), "type": "function",
                          "function": {"name": block.get("name"),
                                       "arguments": json.dumps(block.get("input") or {}, ensure_ascii=False)}})
        # thinking blocks come only when asked for, and a translated chat request never asks
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        reply["tool_calls"] = calls
    choice = {"index": 0, "message": reply, "logprobs": None,
              "finish_reason": FINISH_REASONS.get(message.get("stop_reason") or "end_turn", "stop")}
    return {"id": "chatcmpl-" + str(message.get("id") or "").removeprefix("msg_"), "object": "chat.completion",
            "created": int(time.time()), "model": message.get("model"), "choices": [choice],
            "usage": chat_usage(message.get("usage"))}


def messages_error(error: ApiError) -> dict[str, Any]:
    """An error in Anthropic's shape; the status (and its headers) stay the gateway's."""
    kind = ERROR_TYPES.get(error.status, "api_error" if error.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": error.message}}


def chat_error(body: Any) -> dict[str, Any]:
    """An Anthropic error body in OpenAI's shape, for the gateway's reading of upstream refusals."""
    error = body.get("error") if isinstance(body, dict) else None
    fields = error if isinstance(error, dict) else {}
    return {"error": {"message": fields.get("message"), "type": fields.get("type"), "param": None, "code": None}}
