"""The pieces both directions share: content blocks <-> content parts, tools, tool choices, stop reasons."""

from __future__ import annotations

import json
from typing import Any

from gateway.errors import ApiError, invalid_request

# Messages `stop_reason` -> chat `finish_reason`; `pause_turn` is a server tool's, which chat has not
FINISH_REASONS = {"end_turn": "stop", "stop_sequence": "stop", "max_tokens": "length", "tool_use": "tool_calls",
                  "refusal": "content_filter", "pause_turn": "stop"}
STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use", "function_call": "tool_use",
                "content_filter": "refusal"}
# Messages `tool_choice.type` -> chat `tool_choice`; `tool` names one function
TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}
CHAT_TOOL_CHOICES = {chat: messages for messages, chat in TOOL_CHOICES.items()}


def untranslatable(param: str, what: str) -> ApiError:
    return invalid_request(f"'{param}': {what} cannot be translated between Messages and chat completions", param)


def text_of(content: Any, where: str) -> str:
    """A string, or the text of a list of text blocks/parts, which both APIs allow where only text fits."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, piece in enumerate(content):
            if not isinstance(piece, dict) or piece.get("type") != "text" or not isinstance(piece.get("text"), str):
                raise untranslatable(f"{where}[{j}]", "anything but text here")
            texts.append(piece["text"])
        return "".join(texts)
    raise invalid_request(f"'{where}' must be a string or a list of text blocks", where)


def part_of_block(block: dict[str, Any], where: str) -> dict[str, Any]:
    """A Messages text or image block as a chat content part."""
    if block.get("type") == "text" and isinstance(block.get("text"), str):
        return {"type": "text", "text": block["text"]}
    if block.get("type") == "image":
        source: dict[str, Any] = block["source"] if isinstance(block.get("source"), dict) else {}
        if source.get("type") == "base64" and isinstance(source.get("data"), str):
            url = f"data:{source.get('media_type', 'image/png')};base64,{source['data']}"
            return {"type": "image_url", "image_url": {"url": url}}
        if source.get("type") == "url" and isinstance(source.get("url"), str):
            return {"type": "image_url", "image_url": {"url": source["url"]}}
        raise untranslatable(f"{where}.source", "an image source other than base64 or url")
    raise untranslatable(f"{where}.type", f"a {str(block.get('type'))[:40]!r} block")


def block_of_part(part: dict[str, Any], where: str) -> dict[str, Any]:
    """A chat text or image_url part as a Messages content block."""
    if part.get("type") == "text" and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if part.get("type") == "image_url":
        image: dict[str, Any] = part["image_url"] if isinstance(part.get("image_url"), dict) else {}
        url = image.get("url")
        if not isinstance(url, str):
            raise invalid_request(f"'{where}.image_url.url' must be a string", f"{where}.image_url.url")
        if url.startswith("data:") and ";base64," in url:
            media_type, _, data = url[5:].partition(";base64,")
            return {"type": "image", "source": {"type": "base64", "media_type": media_type, "data": data}}
        return {"type": "image", "source": {"type": "url", "url": url}}
    raise untranslatable(f"{where}.type", f"a {str(part.get('type'))[:40]!r} part")


def function_of_tool(tool: Any, where: str) -> dict[str, Any]:
    """A Messages tool (name, description, input_schema) as a chat function tool."""
    if not isinstance(tool, dict) or not isinstance(tool.get("name"), str):
        raise invalid_request(f"'{where}' must be an object with a 'name'", where)
    if tool.get("type") not in (None, "custom"):
        raise untranslatable(f"{where}.type", f"the server tool {str(tool['type'])[:40]!r}")
    function: dict[str, Any] = {"name": tool["name"], "parameters": tool.get("input_schema") or {"type": "object"}}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def tool_of_function(tool: Any, where: str) -> dict[str, Any]:
    """A chat function tool as a Messages tool."""
    function = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise untranslatable(where, "a tool that is not a function with a name")
    out: dict[str, Any] = {"name": function["name"],
                           "input_schema": function.get("parameters") or {"type": "object", "properties": {}}}
    if isinstance(function.get("description"), str):
        out["description"] = function["description"]
    return out


def arguments_of(call: Any, where: str) -> dict[str, Any]:
    """A chat tool call's `arguments` (a JSON text) as the object a Messages `tool_use.input` is."""
    function = call.get("function") if isinstance(call, dict) else None
    arguments = function.get("arguments") if isinstance(function, dict) else None
    try:
        value = json.loads(arguments) if isinstance(arguments, str) and arguments.strip() else {}
    except ValueError:
        value = None
    if not isinstance(value, dict):
        raise untranslatable(f"{where}.function.arguments", "arguments that are not a JSON object")
    return value
