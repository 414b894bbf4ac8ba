"""Tool calls: the request's `tools` and `tool_choice`, how tools reach the prompt, and calls read from the output.

The format the model is asked for, and the one parsed back, is one block per call:
`<tool_call>{"name": "get_weather", "arguments": {"city": "Paris"}}</tool_call>`.
A template with a tools section gets them through it (transformers' `tools=` convention); templates without
one (SmolLM2's) get the tools as a system prompt in that format; tool results
go back as a user turn of `<tool_response>` blocks. `required` and a named function are enforced by a grammar,
so their arguments always match the function's schema; `auto` is parsed from free output.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from backend.engine.structured_output import Constraint, ConstraintKind
from backend.server.api_errors import invalid
from backend.server.fields.constraints import json_schema_constraint

if TYPE_CHECKING:
    from backend.loading.tokenizer import Tokenizer

MAX_TOOLS = 64
OPEN, CLOSE = "<tool_call>", "</tool_call>"
_FUNCTION_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
_CALL_BLOCK = re.compile(re.escape(OPEN) + r"(.*?)" + re.escape(CLOSE), re.DOTALL)
_TOOL_PROMPT = """You can call functions. Their signatures, as JSON Schema, are inside <tools></tools>:
<tools>
{tools}
</tools>
To call a function, answer with one block per call, each holding a JSON object with its name and arguments:
<tool_call>{{"name": "<function name>", "arguments": {{<arguments>}}}}</tool_call>"""


@dataclass(slots=True)
class ToolRequest:
    """The request's functions, and whether it must (`required`, a named function) or may (`auto`) call them."""

    functions: list[dict[str, Any]]
    choice: str = "auto"  # none | auto | required | function (then `named` holds its name)
    named: str | None = None
    parallel: bool = True

    @property
    def forced(self) -> bool:
        return self.choice in ("required", "function")

    def constraint(self) -> Constraint:
        """The grammar of a forced choice: one or more call blocks whose arguments follow the schemas."""
        allowed = [f for f in self.functions if self.named is None or f["name"] == self.named]
        tags = [{"type": "tag", "begin": f'{OPEN}{{"name": {json.dumps(f["name"])}, "arguments": ',
                 "content": {"type": "json_schema", "json_schema": f["parameters"]}, "end": "}" + CLOSE}
                for f in allowed]
        tag = {"type": "structural_tag", "format": {"type": "tags_with_separator", "separator": "\n",
                                                    "tags": tags, "at_least_one": True,
                                                    "stop_after_first": not self.parallel}}
        return Constraint(ConstraintKind.STRUCTURAL_TAG, json.dumps(tag, sort_keys=True), "tools")


def parse_tools(body: dict[str, Any]) -> ToolRequest | None:
    """The validated tools of a request, or None when it has none or `tool_choice` is `none`."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise invalid("`parallel_tool_calls` must be a boolean", "parallel_tool_calls")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise invalid("`tool_choice` needs `tools`", "tool_choice")
        return None
    if not isinstance(tools, list) or len(tools) > MAX_TOOLS:
        raise invalid(f"`tools` must be a list of at most {MAX_TOOLS} tools", "tools")
    functions = [_function(tool, f"tools[{i}]") for i, tool in enumerate(tools)]
    names = [f["name"] for f in functions]
    if len(set(names)) != len(names):
        raise invalid("`tools` names a function twice", "tools")
    request = ToolRequest(functions, parallel=parallel)
    if choice is None or choice in ("auto", "required", "none"):
        request.choice = choice or "auto"
    elif (isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("function"), dict)
          and choice["function"].get("name") in names):
        request.choice, request.named = "function", choice["function"]["name"]
    else:
        raise invalid("`tool_choice` must be none, auto, required or {\"type\": \"function\", \"function\": "
                      "{\"name\": ...}} naming one of `tools`", "tool_choice")
    return None if request.choice == "none" else request


def chat_message(msg: dict[str, Any], where: str) -> dict[str, Any]:
    """A `tool` message, or an assistant message with `tool_calls`, validated for the prompt."""
    if msg.get("role") == "tool":
        content = msg.get("content")
        if isinstance(content, list):
            content = "\n".join(p.get("text", "") for p in content if isinstance(p, dict))
        if not isinstance(content, str):
            raise invalid(f"`{where}.content` of a tool message must be a string", f"{where}.content")
        return {"role": "tool", "content": content, "tool_call_id": str(msg.get("tool_call_id") or "")}
    calls = msg.get("tool_calls")
    if not isinstance(calls, list) or not calls:
        raise invalid(f"`{where}.tool_calls` must be a non-empty list", f"{where}.tool_calls")
    parsed = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str) or not isinstance(fn.get("arguments"), str):
            raise invalid(f"`{where}.tool_calls[{j}]` must hold `function` with `name` and `arguments` (a JSON "
                          "string)", f"{where}.tool_calls")
        try:
            arguments = json.loads(fn["arguments"])
        except ValueError:
            raise invalid(f"`{where}.tool_calls[{j}].function.arguments` is not valid JSON",
                          f"{where}.tool_calls") from None
        parsed.append({"name": fn["name"], "arguments": arguments})
    content = msg.get("content")
    return {"role": "assistant", "content": content if isinstance(content, str) else "", "tool_calls": parsed}


def render_chat(tokenizer: Tokenizer, messages: list[dict[str, Any]], tools: ToolRequest | None) -> str:
    """The prompt text: through the template's own tools section when it has one, else the generic form."""
    template = tokenizer.chat_template
    if template is None or "tools" not in template.source:
        return tokenizer.apply_chat_template(prompt_messages(messages, tools), add_generation_prompt=True)
    listing = [{"type": "function", "function": f} for f in tools.functions] if tools is not None else None
    shaped = [{**m, "tool_calls": [{"type": "function", "function": c} for c in m["tool_calls"]]}
              if m.get("tool_calls") else m for m in messages]  # transformers' shape: arguments as a dict
    return template.render(shaped, add_generation_prompt=True, tools=listing)


def prompt_messages(messages: list[dict[str, Any]], tools: ToolRequest | None) -> list[dict[str, str]]:
    """The conversation in the generic form: tools in the system prompt, calls and results as text blocks."""
    out: list[dict[str, str]] = []
    for msg in messages:
        if msg["role"] == "tool":
            block = f"<tool_response>\n{msg['content']}\n</tool_response>"
            if out and out[-1].get("tool_results") == "1":  # consecutive results form one user turn
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "tool_results": "1"})
        elif msg.get("tool_calls"):
            blocks = [OPEN + json.dumps(call) + CLOSE for call in msg["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join([msg["content"], *blocks]).strip()})
        else:
            out.append({"role": msg["role"], "content": msg["content"]})
    for msg in out:
        msg.pop("tool_results", None)
    if tools is not None:
        listing = "\n".join(json.dumps({"type": "function", "function": f}) for f in tools.functions)
        prompt = _TOOL_PROMPT.format(tools=listing)
        if out[0]["role"] == "system":
            out[0] = {"role": "system", "content": out[0]["content"] + "\n\n" + prompt}
        else:
            out.insert(0, {"role": "system", "content": prompt})
    return out


def parse_calls(text: str, tools: ToolRequest) -> tuple[str | None, list[dict[str, Any]]]:
    """The content and the tool calls (OpenAI's shape) in a model's output; blocks that do not parse as a
    call of a known function stay in the content."""
    names = {f["name"] for f in tools.functions}
    calls: list[dict[str, Any]] = []
    kept: list[str] = []
    last = 0
    for match in _CALL_BLOCK.finditer(text):
        call = _call(match.group(1), names)
        if call is None:
            continue
        kept.append(text[last:match.start()])
        last = match.end()
        calls.append(call)
    tail = text[last:]
    if calls and OPEN in tail:  # a call cut off by max_tokens: neither a call nor content
        tail = tail[: tail.index(OPEN)]
    kept.append(tail)
    content = "".join(kept).strip()
    if not calls and (bare := _call(text, names)) is not None:  # a bare {"name", "arguments"} object
        calls, content = [bare], ""
    if not tools.parallel:
        calls = calls[:1]
    return (content or None) if calls else text, calls


def _function(tool: Any, where: str) -> dict[str, Any]:
    fn = tool.get("function") if isinstance(tool, dict) and tool.get("type") == "function" else None
    if not isinstance(fn, dict):
        raise invalid(f"`{where}` must be {{\"type\": \"function\", \"function\": {{...}}}}", where)
    name = fn.get("name")
    if not isinstance(name, str) or not _FUNCTION_NAME.match(name):
        raise invalid(f"`{where}.function.name` must be 1-64 letters, digits, `_` or `-`", f"{where}.function.name")
    description = fn.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid(f"`{where}.function.description` must be a string", f"{where}.function.description")
    parameters = fn.get("parameters", {"type": "object", "properties": {}})
    json_schema_constraint(parameters, f"{where}.function.parameters")  # size and keyword limits
    out = {"name": name, "parameters": parameters}
    if description:
        out["description"] = description
    return out


def _call(source: str, names: set[str]) -> dict[str, Any] | None:
    try:
        obj = json.loads(source)
    except ValueError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    if not isinstance(arguments, dict):
        return None
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(arguments)}}
