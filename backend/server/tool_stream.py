"""Tool calls in a stream: a choice's text split into content and tool-call deltas as it is generated.

A forced call (`required`, a named function) follows its grammar exactly, so it is streamed as OpenAI does: a
first delta with the call's id, type, name and empty arguments, then the arguments in fragments. Its first token
thus leaves when generation starts, not when the call is complete. With `auto`, a block may turn out not to be a
call, so it is held until the output is complete and parsed whole.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

from backend.server.tools import CLOSE, OPEN, ToolRequest, parse_calls

# the start of a call block up to its arguments' value, as the forced grammar writes it
_CALL_HEAD = re.compile(r'\s*' + re.escape(OPEN) + r'\s*\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")\s*,\s*"arguments"\s*:\s*')

_SPACED = {",": ", ", ":": ": "}  # json.dumps's separators, outside strings


def tool_stream(tools: ToolRequest) -> ToolStream | ForcedToolStream:
    return ForcedToolStream() if tools.forced else ToolStream(tools)


@dataclass(slots=True)
class ToolStream:
    """Streams content while it cannot be a call; from the first `<tool_call>` (or a leading `{`, maybe a bare
    call object) on, holds the rest for `finish`."""

    tools: ToolRequest
    _held: str = ""
    _holding: bool = False
    _emitted: bool = False

    def push(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        """The part of the output so far that is surely content, and no call deltas: calls wait for `finish`."""
        self._held += text
        if self._holding:
            return "", []
        at = self._held.find(OPEN)
        if at >= 0:
            self._holding = True
        elif not self._emitted and (not self._held.strip() or self._held.lstrip().startswith("{")):
            return "", []
        else:  # keep back a tail that may begin `<tool_call>`
            at = next(i for i in range(len(self._held) + 1) if OPEN.startswith(self._held[i:]))
        ready, self._held = self._held[:at], self._held[at:]
        self._emitted = self._emitted or bool(ready)
        return ready, []

    def finish(self) -> tuple[str, list[dict[str, Any]], bool]:
        """The content still held, the calls as whole deltas, and whether the output called a tool."""
        content, calls = parse_calls(self._held, self.tools)
        if not calls:
            return self._held, [], False
        return content or "", [{"index": i, **call} for i, call in enumerate(calls)], True


@dataclass(slots=True)
class ForcedToolStream:
    """A forced call's blocks as OpenAI's deltas while they are generated; nothing of them is content."""

    _buffer: str = ""
    _calls: int = 0
    _depth: int = -1  # -1: outside any arguments; 0 before the value starts; >0 inside it
    _in_string: bool = False
    _escaped: bool = False
    _closing: bool = False  # the arguments are complete; the block's end is still to come
    _ids: list[str] = field(default_factory=list)

    def push(self, text: str) -> tuple[str, list[dict[str, Any]]]:
        self._buffer += text
        deltas: list[dict[str, Any]] = []
        while True:
            if self._closing:
                close = self._buffer.find(CLOSE)
                if close < 0:
                    break
                self._buffer, self._closing = self._buffer[close + len(CLOSE):], False
            if self._depth < 0:
                head = _CALL_HEAD.match(self._buffer)
                if head is None:
                    break
                self._buffer = self._buffer[head.end():]
                self._ids.append("call_" + uuid.uuid4().hex[:24])
                deltas.append({"index": self._calls, "id": self._ids[-1], "type": "function",
                               "function": {"name": json.loads(head.group(1)), "arguments": ""}})
                self._depth = 0
            fragment, done = self._arguments()
            if fragment:
                deltas.append({"index": self._calls, "function": {"arguments": fragment}})
            if not done:
                break
            self._calls, self._depth, self._closing = self._calls + 1, -1, True
        return "", deltas

    def _arguments(self) -> tuple[str, bool]:
        """The arguments' text read from the buffer, spaced as `json.dumps` spaces it (so the assembled stream
        equals the non-streamed answer), and whether their JSON value is complete."""
        out: list[str] = []
        for i, char in enumerate(self._buffer):
            if not self._in_string and char.isspace():
                continue
            out.append(_SPACED.get(char, char) if not self._in_string else
                       char if char.isascii() else json.dumps(char)[1:-1])
            if self._in_string:
                if self._escaped:
                    self._escaped = False
                elif char == "\\":
                    self._escaped = True
                elif char == '"':
                    self._in_string = False
            elif char == '"':
                self._in_string = True
            elif char in "{[":
                self._depth += 1
            elif char in "}]":
                self._depth -= 1
                if self._depth == 0:
                    self._buffer = self._buffer[i + 1:]
                    return "".join(out), True
        self._buffer = ""
        return "".join(out), False

    def finish(self) -> tuple[str, list[dict[str, Any]], bool]:
        """Nothing held: every call was streamed (one cut by max_tokens stays as far as it got)."""
        return "", [], bool(self._ids)
