"""A Responses API request as the chat completions request it means: pure functions, no I/O.

Input items become chat messages (message items with input_text/input_image parts, function_call items as an
assistant's tool calls, function_call_output items as tool messages), `instructions` the first system message,
function tools chat tools, `text.format` the `response_format`. What has no chat equivalent (hosted tools such as
web_search, reasoning, background runs, file inputs) is a 400 naming the field, never silently dropped.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.errors import invalid_request

# request fields passed on to chat under another name (or the same), when not null
RENAMED = {"temperature": "temperature", "top_p": "top_p", "max_output_tokens": "max_tokens",
           "parallel_tool_calls": "parallel_tool_calls", "user": "user", "safety_identifier": "user",
           "stream": "stream", "priority": "priority"}
# fields the gateway itself reads (the turn's bookkeeping), or that carry no meaning for the answer
OWN_FIELDS = frozenset({"model", "input", "instructions", "tools", "tool_choice", "text", "store", "metadata",
                        "previous_response_id", "stream_options"})
# fields accepted only at the value that changes nothing
NEUTRAL = {"truncation": ("disabled",), "background": (False,), "include": ([],), "service_tier": ("auto", "default"),
           "reasoning": ({},)}
MESSAGE_ROLES = frozenset({"user", "assistant", "system", "developer"})


def chat_body(request: dict[str, Any], history: list[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The chat request, and the conversation's items so far (the `history` of a previous response, then this
    request's input), which a later request continues from."""
    for name, value in request.items():
        if value is None or name in RENAMED or name in OWN_FIELDS:
            continue
        if name not in NEUTRAL:
            raise invalid_request(f"'{name}' is not supported by this gateway's Responses API", name)
        if value not in NEUTRAL[name]:
            raise invalid_request(f"'{name}' = {json.dumps(value)[:60]} is not supported; only "
                                  f"{' or '.join(json.dumps(v) for v in NEUTRAL[name])}", name)
    limit = request.get("max_output_tokens")
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise invalid_request("'max_output_tokens' must be a positive integer", "max_output_tokens")
    items = [*history, *input_items(request.get("input"))]
    body: dict[str, Any] = {"model": request["model"]}
    instructions = request.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise invalid_request("'instructions' must be a string", "instructions")
    system = [{"role": "system", "content": instructions}] if instructions else []
    body["messages"] = [*system, *chat_messages(items)]
    if not body["messages"]:
        raise invalid_request("'input' must hold at least one item", "input")
    for name, chat_name in RENAMED.items():
        if request.get(name) is not None:
            body[chat_name] = request[name]
    if request.get("tools"):
        body["tools"] = chat_tools(request["tools"])
    if request.get("tool_choice") is not None:
        body["tool_choice"] = chat_tool_choice(request["tool_choice"])
    response_format = chat_response_format(request.get("text"))
    if response_format is not None:
        body["response_format"] = response_format
    return body, items


def input_items(value: Any) -> list[dict[str, Any]]:
    """The request's `input` as a list of items: a string is one user message."""
    if isinstance(value, str):
        return [{"type": "message", "role": "user", "content": value}]
    if not isinstance(value, list):
        raise invalid_request("'input' must be a string or an array of items", "input")
    for i, item in enumerate(value):
        if not isinstance(item, dict):
            raise invalid_request(f"'input[{i}]' must be an object", f"input[{i}]")
    return list(value)


def chat_messages(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Chat messages of the items; an assistant's function calls join its message, as chat keeps them."""
    messages: list[dict[str, Any]] = []
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            messages.append(_message(item, where))
        elif kind == "function_call":
            call = {"id": _text(item, "call_id", where), "type": "function",
                    "function": {"name": _text(item, "name", where), "arguments": _text(item, "arguments", where)}}
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            messages.append({"role": "tool", "tool_call_id": _text(item, "call_id", where),
                             "content": _output_text(item.get("output"), where)})
        else:
            raise invalid_request(f"'{where}.type' {str(kind)[:40]!r} cannot be translated to chat completions",
                                  f"{where}.type")
    return messages


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if not isinstance(role, str) or role not in MESSAGE_ROLES:
        raise invalid_request(f"'{where}.role' must be one of {sorted(MESSAGE_ROLES)}", f"{where}.role")
    content = item.get("content")
    if isinstance(content, str):
        return {"role": role, "content": content}
    if not isinstance(content, list):
        raise invalid_request(f"'{where}.content' must be a string or an array of parts", f"{where}.content")
    parts = [_part(part, f"{where}.content[{j}]") for j, part in enumerate(content)]
    if all(part["type"] == "text" for part in parts):
        # plain text reads the same to every upstream, whatever it does with lists of parts
        return {"role": role, "content": "".join(part["text"] for part in parts)}
    return {"role": role, "content": parts}


def _part(part: Any, where: str) -> dict[str, Any]:
    kind = part.get("type") if isinstance(part, dict) else None
    if kind in ("input_text", "output_text") and isinstance(part.get("text"), str):
        return {"type": "text", "text": part["text"]}
    if kind == "refusal" and isinstance(part.get("refusal"), str):
        return {"type": "text", "text": part["refusal"]}
    if kind == "input_image":
        if part.get("file_id") is not None:
            raise invalid_request(f"'{where}.file_id' cannot be translated: send the image as image_url",
                                  f"{where}.file_id")
        url = part.get("image_url")
        if not isinstance(url, str):
            raise invalid_request(f"'{where}.image_url' must be a URL or a data URL", f"{where}.image_url")
        return {"type": "image_url", "image_url": {"url": url, "detail": part.get("detail") or "auto"}}
    raise invalid_request(f"'{where}' must be an input_text, output_text, refusal or input_image part", where)


def _text(item: dict[str, Any], name: str, where: str) -> str:
    value = item.get(name)
    if not isinstance(value, str):
        raise invalid_request(f"'{where}.{name}' must be a string", f"{where}.{name}")
    return value


def _output_text(output: Any, where: str) -> str:
    if isinstance(output, str):
        return output
    if not isinstance(output, list):
        raise invalid_request(f"'{where}.output' must be a string or an array of text parts", f"{where}.output")
    texts = []
    for j, part in enumerate(output):
        converted = _part(part, f"{where}.output[{j}]")
        if converted["type"] != "text":  # a tool message carries text only
            raise invalid_request(f"'{where}.output[{j}]' must be a text part", f"{where}.output[{j}]")
        texts.append(converted["text"])
    return "".join(texts)


def chat_tools(tools: Any) -> list[dict[str, Any]]:
    if not isinstance(tools, list):
        raise invalid_request("'tools' must be an array", "tools")
    out = []
    for i, tool in enumerate(tools):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if kind != "function":
            raise invalid_request(f"'tools[{i}].type' {str(kind)[:40]!r} is a hosted tool this gateway cannot run; "
                                  "only function tools are supported", f"tools[{i}].type")
        function = {name: tool[name] for name in ("name", "description", "parameters", "strict")
                    if tool.get(name) is not None}
        if not isinstance(function.get("name"), str):
            raise invalid_request(f"'tools[{i}].name' must be a string", f"tools[{i}].name")
        out.append({"type": "function", "function": function})
    return out


def chat_tool_choice(choice: Any) -> Any:
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise invalid_request("'tool_choice' must be auto, none, required or {\"type\": \"function\", \"name\": ...}",
                          "tool_choice")


def chat_response_format(text: Any) -> dict[str, Any] | None:
    if text is None:
        return None
    if not isinstance(text, dict):
        raise invalid_request("'text' must be an object", "text")
    if text.get("verbosity") not in (None, "medium"):
        raise invalid_request("'text.verbosity' is not supported (only medium)", "text.verbosity")
    form = text.get("format")
    if form is None or form == {"type": "text"}:
        return None
    kind = form.get("type") if isinstance(form, dict) else None
    if kind == "json_object":
        return {"type": "json_object"}
    if kind == "json_schema":
        schema = {name: form[name] for name in ("name", "schema", "strict", "description") if name in form}
        return {"type": "json_schema", "json_schema": schema}
    raise invalid_request("'text.format.type' must be text, json_object or json_schema", "text.format.type")
