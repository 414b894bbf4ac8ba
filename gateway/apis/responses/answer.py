"""A chat completion as the Responses API's response object: pure functions, no I/O.

The first choice's message becomes a `message` output item (its text an `output_text` part, a refusal a
`refusal` part) and each tool call a `function_call` item; `finish_reason: length` makes the response
`incomplete` for `max_output_tokens`; usage is renamed to input/output tokens.
"""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass, field
from typing import Any

# what the response echoes of its request when the request did not say: OpenAI's defaults
ECHO_DEFAULTS: dict[str, Any] = {
    "instructions": None, "max_output_tokens": None, "metadata": {}, "parallel_tool_calls": True,
    "previous_response_id": None, "temperature": 1.0, "text": {"format": {"type": "text"}}, "tool_choice": "auto",
    "tools": [], "top_p": 1.0, "truncation": "disabled", "user": None, "store": True, "background": False,
}
INCOMPLETE = {"length": "max_output_tokens", "content_filter": "content_filter"}


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(16)}"


@dataclass(slots=True)
class ResponseFrame:
    """What every version of one response (created, in progress, final) shares: its id, model and the request's
    settings it echoes."""

    model: str
    request: dict[str, Any]
    id: str = field(default_factory=lambda: new_id("resp"))
    created_at: int = field(default_factory=lambda: int(time.time()))

    def envelope(self, status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None = None,
                 finish_reason: str | None = None, error: dict[str, Any] | None = None) -> dict[str, Any]:
        incomplete = INCOMPLETE.get(finish_reason) if isinstance(finish_reason, str) else None
        if status == "completed" and incomplete is not None:
            status = "incomplete"
        echoed = {name: self.request[name] if self.request.get(name) is not None else default
                  for name, default in ECHO_DEFAULTS.items()}
        return {"id": self.id, "object": "response", "created_at": self.created_at, "status": status,
                "error": error, "incomplete_details": {"reason": incomplete} if status == "incomplete" else None,
                "model": self.model, "output": output, **echoed,
                "reasoning": {"effort": None, "summary": None}, "usage": usage}


def message_item(item_id: str, text: str | None, refusal: str | None, status: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    if text is not None:
        content.append(text_part(text))
    if refusal is not None:
        content.append({"type": "refusal", "refusal": refusal})
    return {"id": item_id, "type": "message", "status": status, "role": "assistant", "content": content}


def text_part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def function_call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> dict[str, Any]:
    return {"id": item_id, "type": "function_call", "status": status, "call_id": call_id, "name": name,
            "arguments": arguments}


def response_usage(usage: Any) -> dict[str, Any] | None:
    if not isinstance(usage, dict):
        return None
    prompt, completion = _count(usage.get("prompt_tokens")), _count(usage.get("completion_tokens"))
    details = usage.get("prompt_tokens_details")
    cached = _count(details.get("cached_tokens")) if isinstance(details, dict) else 0
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": cached},
            "output_tokens": completion, "output_tokens_details": {"reasoning_tokens": 0},
            "total_tokens": prompt + completion}


def as_object(value: Any) -> dict[str, Any]:
    """A JSON object of an upstream's answer, or an empty one where it sent something else."""
    return value if isinstance(value, dict) else {}


def as_list(value: Any) -> list[Any]:
    """A JSON array of an upstream's answer, or an empty one where it sent something else."""
    return value if isinstance(value, list) else []


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 0


def answer_response(frame: ResponseFrame, completion: dict[str, Any]) -> dict[str, Any]:
    """The final response object of a whole chat completion."""
    choices = as_list(completion.get("choices"))
    choice = as_object(choices[0] if choices else None)
    message = as_object(choice.get("message"))
    finish_reason = choice.get("finish_reason") if isinstance(choice.get("finish_reason"), str) else None
    status = "incomplete" if finish_reason in INCOMPLETE else "completed"
    output: list[dict[str, Any]] = []
    text, refusal = message.get("content"), message.get("refusal")
    if (isinstance(text, str) and text) or isinstance(refusal, str):
        output.append(message_item(new_id("msg"), text if isinstance(text, str) else None,
                                   refusal if isinstance(refusal, str) else None, status))
    for call in as_list(message.get("tool_calls")):
        function = as_object(call).get("function")
        if isinstance(function, dict):
            output.append(function_call_item(new_id("fc"), str(call.get("id") or new_id("call")),
                                             str(function.get("name") or ""), str(function.get("arguments") or ""),
                                             "completed"))
    return frame.envelope("completed", output, response_usage(completion.get("usage")), finish_reason)

