"""Requests: an Anthropic Messages body as an OpenAI chat body (`chat_request`), and back (`messages_request`).

Whatever one side has and the other cannot carry is a 400 naming the field, never dropped on the way.
"""

from __future__ import annotations

import json
from typing import Any

from gateway.anthropic_wire.content import (
    CHAT_TOOL_CHOICES,
    TOOL_CHOICES,
    arguments_of,
    block_of_part,
    function_of_tool,
    part_of_block,
    text_of,
    tool_of_function,
    untranslatable,
)
from gateway.errors import invalid_request

# fields carried under the same name both ways; `priority` is tidegate's own class extension
SAME_NAMES = ("model", "max_tokens", "stream", "temperature", "top_p", "top_k", "priority")
# `cache_control` (here and on blocks) is accepted and has nothing to do: the backend caches prefixes by itself
MESSAGES_FIELDS = frozenset({*SAME_NAMES, "messages", "system", "stop_sequences", "metadata", "tools",
                             "tool_choice", "cache_control"})
# `stream_options` is dropped on purpose: a Messages stream always ends with its usage
CHAT_FIELDS = frozenset({*SAME_NAMES, "messages", "max_completion_tokens", "stop", "user", "tools", "tool_choice",
                         "parallel_tool_calls", "stream_options", "n"}) - {"priority"}
SYSTEM_ROLES = ("system", "developer")


def chat_request(body: dict[str, Any]) -> dict[str, Any]:
    """A Messages request as the chat request the rest of the gateway serves."""
    unknown = sorted(set(body) - MESSAGES_FIELDS)
    if unknown:
        raise untranslatable(unknown[0], "this field")
    limit = body.get("max_tokens")
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise invalid_request("'max_tokens' is required and must be a positive integer", "max_tokens")
    chat = {name: body[name] for name in SAME_NAMES if name in body}
    turns = body.get("messages")
    if not isinstance(turns, list) or not turns:
        raise invalid_request("'messages' must be a non-empty array", "messages")
    system = [] if body.get("system") is None else [{"role": "system", "content": text_of(body["system"], "system")}]
    chat["messages"] = system + [m for i, turn in enumerate(turns) for m in _turn_in(turn, f"messages[{i}]")]
    if "stop_sequences" in body:
        stops = body["stop_sequences"]
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise invalid_request("'stop_sequences' must be an array of strings", "stop_sequences")
        chat["stop"] = stops
    if body.get("metadata") is not None:
        chat.update(_metadata_in(body["metadata"]))
    if body.get("tools") is not None:
        if not isinstance(body["tools"], list):
            raise invalid_request("'tools' must be an array", "tools")
        chat["tools"] = [function_of_tool(tool, f"tools[{i}]") for i, tool in enumerate(body["tools"])]
    if body.get("tool_choice") is not None:
        chat.update(_tool_choice_in(body["tool_choice"]))
    return chat


def _turn_in(turn: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(turn, dict) or turn.get("role") not in ("user", "assistant"):
        raise invalid_request(f"'{where}' must be an object with role 'user' or 'assistant'", f"{where}.role")
    role, content = turn["role"], turn.get("content")
    if isinstance(content, str):
        return [{"role": role, "content": content}]
    if not isinstance(content, list) or not all(isinstance(block, dict) for block in content):
        raise invalid_request(f"'{where}.content' must be a string or an array of blocks", f"{where}.content")
    return _user_in(content, where) if role == "user" else [_assistant_in(content, where)]


def _user_in(blocks: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """Tool results become `tool` messages, which chat wants right after the assistant's calls; the rest stays
    one user message of parts."""
    tools: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if block.get("type") == "tool_result":
            text = text_of(block.get("content") or "", f"{at}.content")
            if block.get("is_error"):
                text = f"Error: {text}"  # chat's tool message has no error flag; the model reads it from the text
            tools.append({"role": "tool", "tool_call_id": str(block.get("tool_use_id") or ""), "content": text})
        else:
            parts.append(part_of_block(block, at))
    if not parts:
        return tools
    return [*tools, {"role": "user", "content": parts}]


def _assistant_in(blocks: list[dict[str, Any]], where: str) -> dict[str, Any]:
    texts, calls = [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if block.get("type") == "tool_use":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), dict):
                raise invalid_request(f"'{at}' needs a 'name' and an object 'input'", at)
            arguments = json.dumps(block.get("input", {}), ensure_ascii=False)
            calls.append({"id": str(block.get("id") or f"call_{j}"), "type": "function",
                          "function": {"name": block["name"], "arguments": arguments}})
        elif block.get("type") == "text":
            texts.append(text_of([block], f"{where}.content"))
        else:
            raise untranslatable(f"{at}.type", f"a {str(block.get('type'))[:40]!r} block in an assistant turn")
    message: dict[str, Any] = {"role": "assistant", "content": "".join(texts) if texts or not calls else None}
    if calls:
        message["tool_calls"] = calls
    return message


def _metadata_in(metadata: Any) -> dict[str, Any]:
    if not isinstance(metadata, dict):
        raise invalid_request("'metadata' must be an object", "metadata")
    unknown = sorted(set(metadata) - {"user_id"})
    if unknown:
        raise untranslatable(f"metadata.{unknown[0]}", "this field")
    user = metadata.get("user_id")
    if user is not None and not isinstance(user, str):
        raise invalid_request("'metadata.user_id' must be a string", "metadata.user_id")
    return {} if user is None else {"user": user}


def _tool_choice_in(choice: Any) -> dict[str, Any]:
    kind = choice.get("type") if isinstance(choice, dict) else None
    out: dict[str, Any] = {}
    if kind == "tool" and isinstance(choice.get("name"), str):
        out["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    elif kind in TOOL_CHOICES:
        out["tool_choice"] = TOOL_CHOICES[kind]
    else:
        raise invalid_request("'tool_choice.type' must be auto, any, tool (with a name) or none", "tool_choice")
    if choice.get("disable_parallel_tool_use"):
        out["parallel_tool_calls"] = False
    return out


def messages_request(chat: dict[str, Any], default_max_tokens: int) -> dict[str, Any]:
    """A chat request as the Messages request an Anthropic upstream takes."""
    unknown = sorted(set(chat) - CHAT_FIELDS)
    if unknown:
        raise untranslatable(unknown[0], "this field (an anthropic channel has no such parameter)")
    if chat.get("n") not in (None, 1):
        raise untranslatable("n", "more than one choice")
    body = {name: chat[name] for name in SAME_NAMES if name in chat and name != "priority"}
    # chat's own order (gateway/path/admission.py bound_output): the limit the gateway reserved, never a larger one
    body["max_tokens"] = chat.get("max_completion_tokens") or chat.get("max_tokens") or default_max_tokens
    system, turns = _turns_out(chat.get("messages") or [])
    if system:
        body["system"] = system
    body["messages"] = turns
    stop = chat.get("stop")
    if stop is not None:
        body["stop_sequences"] = [stop] if isinstance(stop, str) else stop
    if chat.get("user") is not None:
        body["metadata"] = {"user_id": chat["user"]}
    if chat.get("tools"):
        body["tools"] = [tool_of_function(tool, f"tools[{i}]") for i, tool in enumerate(chat["tools"])]
    choice = _tool_choice_out(chat.get("tool_choice"), chat.get("parallel_tool_calls"))
    if choice is not None:
        body["tool_choice"] = choice
    return body


def _turns_out(messages: list[Any]) -> tuple[str, list[dict[str, Any]]]:
    """The leading system messages as Messages' `system`, the rest as alternating turns of blocks."""
    system: list[str] = []
    turns: list[dict[str, Any]] = []
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role") if isinstance(message, dict) else None
        if role in SYSTEM_ROLES:
            if turns:
                raise untranslatable(f"{where}.role", "a system message after the first turn")
            system.append(text_of(message.get("content"), f"{where}.content"))
            continue
        blocks = _blocks_out(message, role, where)
        anthropic_role = "assistant" if role == "assistant" else "user"
        if turns and turns[-1]["role"] == anthropic_role:  # Messages alternates: same-role turns are one turn
            turns[-1]["content"].extend(blocks)
        else:
            turns.append({"role": anthropic_role, "content": blocks})
    return "\n\n".join(system), turns


def _blocks_out(message: dict[str, Any], role: Any, where: str) -> list[dict[str, Any]]:
    content = message.get("content")
    if role == "tool":
        return [{"type": "tool_result", "tool_use_id": str(message.get("tool_call_id") or ""),
                 "content": text_of(content, f"{where}.content")}]
    if role not in ("user", "assistant"):
        raise untranslatable(f"{where}.role", f"the role {str(role)[:40]!r}")
    blocks: list[dict[str, Any]]
    if isinstance(content, str):
        blocks = [{"type": "text", "text": content}] if content else []
    elif isinstance(content, list):
        blocks = [block_of_part(part if isinstance(part, dict) else {}, f"{where}.content[{j}]")
                  for j, part in enumerate(content)]
    elif content is None:
        blocks = []
    else:
        raise invalid_request(f"'{where}.content' must be a string or an array", f"{where}.content")
    for j, call in enumerate(message.get("tool_calls") or ()):
        at = f"{where}.tool_calls[{j}]"
        name = call.get("function", {}).get("name") if isinstance(call, dict) else None
        if not isinstance(name, str):
            raise invalid_request(f"'{at}.function.name' must be a string", f"{at}.function.name")
        blocks.append({"type": "tool_use", "id": str(call.get("id") or f"toolu_{j}"), "name": name,
                       "input": arguments_of(call, at)})
    return blocks


def _tool_choice_out(choice: Any, parallel: Any) -> dict[str, Any] | None:
    if choice is None and parallel is not False:
        return None
    if choice is None or choice in CHAT_TOOL_CHOICES:
        out: dict[str, Any] = {"type": CHAT_TOOL_CHOICES.get(choice or "auto")}
    elif isinstance(choice, dict) and isinstance(choice.get("function"), dict) \
            and isinstance(choice["function"].get("name"), str):
        out = {"type": "tool", "name": choice["function"]["name"]}
    else:
        raise invalid_request("'tool_choice' must be none, auto, required or a named function", "tool_choice")
    if parallel is False:
        out["disable_parallel_tool_use"] = True
    return out
