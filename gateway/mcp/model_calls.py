"""A tool call a model asked for (a Responses `mcp` tool, a Messages `mcp_servers` entry): its JSON arguments run
through the gateway's call path, and its result as the text the model reads next."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import mcp_types as types

from gateway.mcp.calls import CallRefused, McpCalls, ToolCall
from quota import KeyInfo


@dataclass(slots=True)
class ModelCallOutcome:
    arguments: dict[str, Any] | None  # as the model wrote them; None when they are not a JSON object
    output: str | None  # what the tool answered, as text
    error: str | None  # why it failed (refused, past a quota, timed out, or the tool's own error)

    @property
    def text(self) -> str:
        """What the model is told."""
        return f"error: {self.error}" if self.error is not None else self.output or ""


async def run_model_call(calls: McpCalls, key: KeyInfo, name: str, arguments: str | dict[str, Any],
                         request_id: str, headers: Mapping[str, str]) -> ModelCallOutcome:
    parsed = parsed_arguments(arguments) if isinstance(arguments, str) else arguments
    if parsed is None:
        return ModelCallOutcome(None, None, "the arguments are not a JSON object")
    try:
        result = await calls.call(ToolCall(key, name, parsed, request_id, dict(headers)))
    except CallRefused as refused:
        return ModelCallOutcome(parsed, None, refused.message)
    text = result_text(result)
    return ModelCallOutcome(parsed, None, text) if result.is_error else ModelCallOutcome(parsed, text, None)


def result_text(result: types.CallToolResult) -> str:
    """What the model reads of a tool's result: its text parts, else the structured content or parts as JSON."""
    texts = [part.text for part in result.content if isinstance(part, types.TextContent)]
    if texts:
        return "\n".join(texts)
    if result.structured_content is not None:
        return json.dumps(result.structured_content)
    return json.dumps([part.model_dump(mode="json", exclude_none=True) for part in result.content])


def parsed_arguments(arguments: str) -> dict[str, Any] | None:
    """The model's arguments as an object; None when they are not one."""
    try:
        value = json.loads(arguments or "{}")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
