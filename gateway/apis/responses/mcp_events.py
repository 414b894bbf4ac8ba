"""A finished response with `mcp` tools as the Responses API's stream events: pure, no I/O.

The rounds of model and tool calls run first; the stream then carries the whole response in OpenAI's event order
(`response.created`, `response.in_progress`, each output item added, its text, done, and `response.completed`),
so that a client that asked for `stream: true` reads the shape it expects, its text in one delta per part.
"""

from __future__ import annotations

from typing import Any

Event = dict[str, Any]


def response_events(response: dict[str, Any]) -> list[Event]:
    events: list[Event] = []

    def event(kind: str, **fields: Any) -> None:
        events.append({"type": kind, **fields, "sequence_number": len(events)})

    started = {**response, "status": "in_progress", "output": [], "usage": None}
    event("response.created", response=started)
    event("response.in_progress", response=started)
    for index, item in enumerate(response["output"]):
        event("response.output_item.added", output_index=index,
              item={**item, "content": []} if item.get("type") == "message" else item)
        for part_index, part in enumerate(item.get("content") or [] if item.get("type") == "message" else []):
            where = {"item_id": item["id"], "output_index": index, "content_index": part_index}
            kind = part.get("type")
            event("response.content_part.added", **where, part={**part, _text_field(kind): ""})
            if kind == "output_text":
                event("response.output_text.delta", **where, delta=part.get("text", ""), logprobs=[])
                event("response.output_text.done", **where, text=part.get("text", ""), logprobs=[])
            elif kind == "refusal":
                event("response.refusal.delta", **where, delta=part.get("refusal", ""))
                event("response.refusal.done", **where, refusal=part.get("refusal", ""))
            event("response.content_part.done", **where, part=part)
        event("response.output_item.done", output_index=index, item=item)
    event("response.completed" if response["status"] == "completed" else "response.incomplete", response=response)
    return events


def _text_field(kind: Any) -> str:
    return "refusal" if kind == "refusal" else "text"
