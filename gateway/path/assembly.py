"""A streamed answer folded back into the whole (non-streamed) answer its upstream would have sent.

The gateway streams non-streamed requests upstream so that the first-token and idle deadlines mean what they
say; the client still gets one JSON body in OpenAI's shape: `chat.completion` with a `message` per choice, or
`text_completion` with its `text`, the choices in index order, logprobs and tool calls merged, and the usage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

# envelope fields a chunk carries that a whole answer does not, or that are built here
NOT_COPIED = frozenset({"object", "choices", "usage"})
ENVELOPE_ORDER: tuple[str, ...] = ("id", "object", "created", "model")
CHOICE_FIELDS = frozenset({"index", "delta", "text", "logprobs", "finish_reason"})


@dataclass(slots=True)
class ChoiceParts:
    """One choice's pieces as they arrived, in order."""

    index: int
    role: str | None = None
    content: list[str] | None = None  # None: the upstream sent no content at all (a tool call alone)
    refusal: list[str] | None = None
    tool_calls: dict[int, dict[str, Any]] = field(default_factory=dict)
    logprobs: dict[str, Any] | None = None
    finish_reason: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)  # message fields this module does not know, as sent
    choice_extra: dict[str, Any] = field(default_factory=dict)  # choice fields it does not know (`stop_reason`)


class Assembly:
    """Takes an answer's chunks one by one (`add`), then builds the whole answer (`answer`)."""

    def __init__(self, chat: bool, model: str):
        self.chat = chat
        self.model = model  # the public name the client asked for
        self.envelope: dict[str, Any] = {}
        self.choices: dict[int, ChoiceParts] = {}
        self.usage: dict[str, Any] | None = None
        self._known: set[str] | frozenset[str] = NOT_COPIED  # fields the envelope holds, or never takes

    def add(self, chunk: dict[str, Any]) -> None:
        # set comparisons of key views run in C: a chunk that brings no new envelope field (all but the first)
        # or no unknown choice field costs no Python loop over its fields
        if not chunk.keys() <= self._known:
            for name, value in chunk.items():
                if name not in NOT_COPIED:
                    self.envelope.setdefault(name, value)
            self._known = self.envelope.keys() | NOT_COPIED
        usage = chunk.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
        for choice in chunk.get("choices") or ():
            if isinstance(choice, dict):
                self._add_choice(choice)

    def answer(self) -> dict[str, Any]:
        whole = {**self.envelope, "object": "chat.completion" if self.chat else "text_completion",
                 "model": self.model}
        # OpenAI's order: id, object, created, model, choices, usage, then the rest (system_fingerprint, ...)
        ordered: dict[str, Any] = {name: whole.pop(name) for name in ENVELOPE_ORDER if name in whole}
        ordered["choices"] = [self._choice(self.choices[i]) for i in sorted(self.choices)]
        if self.usage is not None:
            ordered["usage"] = self.usage
        return {**ordered, **whole}

    def _add_choice(self, choice: dict[str, Any]) -> None:
        index = int(choice.get("index") or 0)
        parts = self.choices.get(index)
        if parts is None:
            parts = self.choices[index] = ChoiceParts(index)
        finish_reason = choice.get("finish_reason")
        if finish_reason is not None:
            parts.finish_reason = finish_reason
        logprobs = choice.get("logprobs")
        if isinstance(logprobs, dict):
            parts.logprobs = merge_logprobs(parts.logprobs, logprobs)
        if not choice.keys() <= CHOICE_FIELDS:
            for name, value in choice.items():
                if name not in CHOICE_FIELDS and (value is not None or name not in parts.choice_extra):
                    parts.choice_extra[name] = value
        if not self.chat:
            text = choice.get("text")
            if isinstance(text, str):
                parts.content = _appended(parts.content, text)
            return
        delta = choice.get("delta") or {}
        for name, value in delta.items():
            if name == "content":
                if isinstance(value, str):
                    parts.content = _appended(parts.content, value)
            elif name == "role":
                parts.role = parts.role or value
            elif name == "refusal":
                if isinstance(value, str):
                    parts.refusal = _appended(parts.refusal, value)
            elif name == "tool_calls":
                for call in value or ():
                    merge_tool_call(parts.tool_calls, call)
            elif value is not None:
                parts.extra.setdefault(name, value)

    def _choice(self, parts: ChoiceParts) -> dict[str, Any]:
        content = "".join(parts.content) if parts.content is not None else None
        if not self.chat:
            return {"index": parts.index, "text": content or "", "logprobs": parts.logprobs,
                    "finish_reason": parts.finish_reason, **parts.choice_extra}
        message: dict[str, Any] = {"role": parts.role or "assistant", "content": content}
        if parts.refusal is not None:
            message["refusal"] = "".join(parts.refusal)
        if parts.tool_calls:
            message["tool_calls"] = [parts.tool_calls[i] for i in sorted(parts.tool_calls)]
        message.update(parts.extra)
        return {"index": parts.index, "message": message, "logprobs": parts.logprobs,
                "finish_reason": parts.finish_reason, **parts.choice_extra}


def _appended(pieces: list[str] | None, text: str) -> list[str]:
    if pieces is None:
        return [text]
    pieces.append(text)
    return pieces


def merge_tool_call(calls: dict[int, dict[str, Any]], delta: dict[str, Any]) -> None:
    """A tool call arrives in pieces by its `index`: the id, type and name first, the arguments in fragments."""
    index = int(delta.get("index") or 0)
    call = calls.setdefault(index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}})
    for name, value in delta.items():
        if name == "function" and isinstance(value, dict):
            for part, text in value.items():
                if isinstance(text, str):
                    call["function"][part] = call["function"].get(part, "") + text
        elif name != "index" and value is not None:
            call[name] = value


def merge_logprobs(whole: dict[str, Any] | None, piece: dict[str, Any]) -> dict[str, Any]:
    """Lists (chat's `content`, completions' `tokens`, `token_logprobs`, ...) are extended; the rest is kept."""
    merged: dict[str, Any] = {} if whole is None else whole
    for name, value in piece.items():
        if isinstance(value, list) and isinstance(merged.get(name), list):
            merged[name].extend(value)
        elif value is not None or name not in merged:
            merged[name] = list(value) if isinstance(value, list) else value  # a copy: later pieces extend it
    return merged
