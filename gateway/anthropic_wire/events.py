"""Streams: chat chunks as Messages events (`MessagesEvents`), and Messages events as chat chunks (`ChatChunks`).

Both are fed one parsed object at a time and say what to send for it, so either direction is a plain loop.
"""

from __future__ import annotations

import time
from typing import Any

from gateway.anthropic_wire.answer import chat_usage, message_id, messages_usage, stop_of
from gateway.anthropic_wire.content import FINISH_REASONS

Event = tuple[str, dict[str, Any]]  # (SSE event name, its data), the name repeated as the data's `type`


def event(name: str, **data: Any) -> Event:
    return name, {"type": name, **data}


class MessagesEvents:
    """Turns the chunks of one chat stream into the events of one Messages stream."""

    def __init__(self, model: str, input_tokens: int):
        self._model = model
        self._input_tokens = input_tokens  # the estimate until the usage chunk says
        self._started = False
        self._block: tuple[str, int] | None = None  # the open block: ("text", -1) or ("tool_use", its call index)
        self._blocks = 0
        self._stop: tuple[str | None, str | None] = (None, None)
        self._usage: dict[str, Any] | None = None

    def add(self, chunk: dict[str, Any]) -> list[Event]:
        out = self._start(chunk)
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        for choice in chunk.get("choices") or ():
            if not isinstance(choice, dict) or choice.get("index", 0) != 0:
                continue
            delta = choice["delta"] if isinstance(choice.get("delta"), dict) else {}
            if isinstance(delta.get("content"), str) and delta["content"]:
                out += self._open(("text", -1), {"type": "text", "text": ""})
                out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            calls = delta["tool_calls"] if isinstance(delta.get("tool_calls"), list) else []
            for call in (c for c in calls if isinstance(c, dict)):
                out += self._tool_call(call)
            if choice.get("finish_reason") is not None:
                self._stop = stop_of(choice)
        return out

    def finish(self) -> list[Event]:
        """The closing events, once the chat stream is done."""
        out = self._start({}) + self._close()
        usage = messages_usage(self._usage) if self._usage is not None else {"output_tokens": 0}
        stop_reason, stop_sequence = self._stop
        out.append(event("message_delta", delta={"stop_reason": stop_reason or "end_turn",
                                                 "stop_sequence": stop_sequence}, usage=usage))
        out.append(event("message_stop"))
        return out

    def _start(self, chunk: dict[str, Any]) -> list[Event]:
        if self._started:
            return []
        self._started = True
        message: dict[str, Any] = {"id": message_id(chunk.get("id")), "type": "message", "role": "assistant", "model": self._model,
                   "content": [], "stop_reason": None, "stop_sequence": None,
                   "usage": {"input_tokens": self._input_tokens, "output_tokens": 0}}
        return [event("message_start", message=message), event("ping")]

    def _tool_call(self, call: dict[str, Any]) -> list[Event]:
        index = call["index"] if isinstance(call.get("index"), int) else 0
        function = call["function"] if isinstance(call.get("function"), dict) else {}
        out: list[Event] = []
        if self._block != ("tool_use", index):
            out += self._open(("tool_use", index), {"type": "tool_use", "id": call.get("id") or f"toolu_{index}",
                                                    "name": function.get("name") or "", "input": {}})
        if function.get("arguments"):
            out.append(self._delta({"type": "input_json_delta", "partial_json": function["arguments"]}))
        return out

    def _open(self, block: tuple[str, int], content_block: dict[str, Any]) -> list[Event]:
        if self._block == block:
            return []
        out = self._close()
        self._block = block
        out.append(event("content_block_start", index=self._blocks, content_block=content_block))
        return out

    def _delta(self, delta: dict[str, Any]) -> Event:
        return event("content_block_delta", index=self._blocks, delta=delta)

    def _close(self) -> list[Event]:
        if self._block is None:
            return []
        self._block = None
        self._blocks += 1
        return [event("content_block_stop", index=self._blocks - 1)]


class ChatChunks:
    """Turns the events of one Messages stream into the chunks of one chat stream."""

    def __init__(self) -> None:
        self._base: dict[str, Any] = {"id": "chatcmpl-tidegate", "object": "chat.completion.chunk",
                                      "created": int(time.time()), "model": None}
        self._usage: dict[str, Any] = {}
        self._tools: dict[int, int] = {}  # Messages block index -> chat tool call index

    def add(self, data: dict[str, Any]) -> list[dict[str, Any]]:
        kind = data.get("type")
        if kind == "message_start":
            message = data.get("message") or {}
            self._base["id"] = "chatcmpl-" + str(message.get("id") or "").removeprefix("msg_")
            self._base["model"] = message.get("model")
            self._usage.update(message.get("usage") or {})
            return [self._chunk({"role": "assistant", "content": ""})]
        if kind == "content_block_start":
            block = data.get("content_block") or {}
            if block.get("type") == "tool_use":
                index = self._tools.setdefault(int(data.get("index") or 0), len(self._tools))
                return [self._chunk({"tool_calls": [{"index": index, "id": block.get("id"), "type": "function",
                                                     "function": {"name": block.get("name"), "arguments": ""}}]})]
            text = block.get("text")
            return [self._chunk({"content": text})] if block.get("type") == "text" and text else []
        if kind == "content_block_delta":
            return self._delta(int(data.get("index") or 0), data.get("delta") or {})
        if kind == "message_delta":
            self._usage.update({k: v for k, v in (data.get("usage") or {}).items() if v is not None})
            reason = (data.get("delta") or {}).get("stop_reason") or "end_turn"
            finish = self._chunk({}, FINISH_REASONS.get(reason, "stop"))
            return [finish, {**self._base, "choices": [], "usage": chat_usage(self._usage)}]
        if kind == "error":
            return [{"error": data.get("error") or {}}]  # the relay ends a stream that carries an error
        return []  # ping, content_block_stop, message_stop (the caller's [DONE])

    def _delta(self, index: int, delta: dict[str, Any]) -> list[dict[str, Any]]:
        if delta.get("type") == "text_delta":
            return [self._chunk({"content": delta.get("text") or ""})]
        if delta.get("type") == "input_json_delta" and index in self._tools:
            call = {"index": self._tools[index], "function": {"arguments": delta.get("partial_json") or ""}}
            return [self._chunk({"tool_calls": [call]})]
        return []  # thinking and signature deltas come only when asked for, and a chat request never asks

    def _chunk(self, delta: dict[str, Any], finish_reason: str | None = None) -> dict[str, Any]:
        return {**self._base, "choices": [{"index": 0, "delta": delta, "logprobs": None,
                                           "finish_reason": finish_reason}]}
