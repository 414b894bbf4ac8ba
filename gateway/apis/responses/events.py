"""Chat completion chunks as the Responses API's stream events: a pure state machine, fed chunk by chunk.

The events follow OpenAI's order: `response.created` and `response.in_progress`; for each output item
`response.output_item.added`, then its content (`response.content_part.added` and `response.output_text.delta`
for text, `response.function_call_arguments.delta` for a function call); at the end each item's `.done` events in
output order and `response.completed` (or `response.failed`), every event numbered by `sequence_number`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from gateway.apis.responses.answer import (
    ResponseFrame,
    as_list,
    as_object,
    function_call_item,
    message_item,
    new_id,
    response_usage,
    text_part,
)
from gateway.errors import ApiError

Event = dict[str, Any]
PART_DELTA = {"output_text": "response.output_text.delta", "refusal": "response.refusal.delta"}
PART_DONE = {"output_text": "response.output_text.done", "refusal": "response.refusal.done"}
PART_FIELD = {"output_text": "text", "refusal": "refusal"}


@dataclass(slots=True)
class OpenItem:
    """An output item being streamed: a message's parts (kind, pieces) or a function call's arguments."""

    index: int
    item: dict[str, Any]
    parts: list[tuple[str, list[str]]] = field(default_factory=list)
    arguments: list[str] = field(default_factory=list)


class ResponseEvents:
    """`start`, then `add` for each chunk, then `finish` (or `fail`); each returns the events to send."""

    def __init__(self, frame: ResponseFrame):
        self.frame = frame
        self.final: dict[str, Any] | None = None  # the last response object, once finished
        self._sequence = 0
        self._items: list[OpenItem] = []
        self._message: OpenItem | None = None
        self._calls: dict[int, OpenItem] = {}  # by the chunk's tool call index
        self._finish_reason: str | None = None
        self._usage: dict[str, Any] | None = None

    def start(self) -> list[Event]:
        response = self.frame.envelope("in_progress", [])
        return [self._event("response.created", response=response),
                self._event("response.in_progress", response=response)]

    def add(self, chunk: dict[str, Any]) -> list[Event]:
        if isinstance(chunk.get("usage"), dict):
            self._usage = chunk["usage"]
        events: list[Event] = []
        for choice in as_list(chunk.get("choices")):
            if not isinstance(choice, dict) or (choice.get("index") or 0) != 0:
                continue  # the Responses API has one output: other choices have no place in it
            if isinstance(choice.get("finish_reason"), str):
                self._finish_reason = choice["finish_reason"]
            delta = as_object(choice.get("delta"))
            for kind, name in (("output_text", "content"), ("refusal", "refusal")):
                if isinstance(delta.get(name), str) and delta[name]:
                    events += self._text(kind, delta[name])
            for call in as_list(delta.get("tool_calls")):
                if isinstance(call, dict):
                    events += self._call(call)
        return events

    def finish(self) -> list[Event]:
        """The done events of every item, then `response.completed` (status `incomplete` when cut by length)."""
        events: list[Event] = []
        output = []
        for open_item in self._items:
            events += self._close(open_item)
            output.append(open_item.item)
        self.final = self.frame.envelope("completed", output, response_usage(self._usage), self._finish_reason)
        kind = "response.completed" if self.final["status"] == "completed" else "response.incomplete"
        return [*events, self._event(kind, response=self.final)]

    def fail(self, error: ApiError) -> list[Event]:
        """`response.failed` with what was generated so far, then the `error` event that ends the stream."""
        self.final = self.frame.envelope("failed", [i.item for i in self._items], response_usage(self._usage),
                                         error={"code": error.code, "message": error.message})
        return [self._event("response.failed", response=self.final),
                self._event("error", code=error.code, message=error.message, param=error.param,
                            error=error.body()["error"])]

    def _text(self, kind: str, piece: str) -> list[Event]:
        events: list[Event] = []
        message = self._message
        if message is None:
            message = self._message = self._open(message_item(new_id("msg"), None, None, "in_progress"))
            events.append(self._added(message))
        if not message.parts or message.parts[-1][0] != kind:
            message.parts.append((kind, []))
            part = {"type": kind, PART_FIELD[kind]: ""} if kind == "refusal" else text_part("")
            events.append(self._event("response.content_part.added", item_id=message.item["id"],
                                      output_index=message.index, content_index=len(message.parts) - 1, part=part))
        message.parts[-1][1].append(piece)
        extra: dict[str, Any] = {"logprobs": []} if kind == "output_text" else {}
        events.append(self._event(PART_DELTA[kind], item_id=message.item["id"], output_index=message.index,
                                  content_index=len(message.parts) - 1, delta=piece, **extra))
        return events

    def _call(self, delta: dict[str, Any]) -> list[Event]:
        events: list[Event] = []
        index = delta["index"] if isinstance(delta.get("index"), int) else 0
        function = as_object(delta.get("function"))
        call = self._calls.get(index)
        if call is None:
            item = function_call_item(new_id("fc"), str(delta.get("id") or new_id("call")),
                                      str(function.get("name") or ""), "", "in_progress")
            call = self._calls[index] = self._open(item)
            events.append(self._added(call))
        elif isinstance(function.get("name"), str) and not call.item["name"]:
            call.item["name"] = function["name"]
        piece = function.get("arguments")
        if isinstance(piece, str) and piece:
            call.arguments.append(piece)
            events.append(self._event("response.function_call_arguments.delta", item_id=call.item["id"],
                                      output_index=call.index, delta=piece))
        return events

    def _open(self, item: dict[str, Any]) -> OpenItem:
        open_item = OpenItem(len(self._items), item)
        self._items.append(open_item)
        return open_item

    def _added(self, open_item: OpenItem) -> Event:
        return self._event("response.output_item.added", output_index=open_item.index, item=dict(open_item.item))

    def _close(self, open_item: OpenItem) -> list[Event]:
        item, where = open_item.item, {"item_id": open_item.item["id"], "output_index": open_item.index}
        status = "incomplete" if self._finish_reason == "length" else "completed"
        events: list[Event] = []
        if item["type"] == "function_call":
            item.update(arguments="".join(open_item.arguments), status="completed")
            events.append(self._event("response.function_call_arguments.done", **where, name=item["name"],
                                      arguments=item["arguments"]))
        else:
            item.update(message_item(item["id"], None, None, status))
            for content_index, (kind, pieces) in enumerate(open_item.parts):
                text = "".join(pieces)
                part = text_part(text) if kind == "output_text" else {"type": kind, "refusal": text}
                item["content"].append(part)
                extra: dict[str, Any] = {"logprobs": []} if kind == "output_text" else {}
                events.append(self._event(PART_DONE[kind], **where, content_index=content_index,
                                          **{PART_FIELD[kind]: text}, **extra))
                events.append(self._event("response.content_part.done", **where, content_index=content_index,
                                          part=part))
        events.append(self._event("response.output_item.done", output_index=open_item.index, item=item))
        return events

    def _event(self, kind: str, **fields: Any) -> Event:
        event = {"type": kind, **fields, "sequence_number": self._sequence}
        self._sequence += 1
        return event
