"""OpenAI request parsing: a JSON body becomes one validated `ValidatedRequest`, or an `ApiError` (400).

Parsing needs no tokenizer; the server tokenizes the prompt afterwards and checks it with
`check_token_ids` and `resolve_max_tokens`, which also live here so every rule about a request is in one place.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from backend.engine.choices import MAX_CHOICES
from backend.engine.sampling_params import SamplingParams
from backend.engine.structured_output import Constraint
from backend.server.api_errors import invalid, unsupported
from backend.server.fields.body import bool_field, int_field, str_or_none, utf8
from backend.server.fields.constraints import parse_constraint
from backend.server.fields.sampling import read_sampling, sampling_params
from backend.server.tools import ToolRequest, chat_message, parse_tools
from common.request_body import decode_json

# Roles the chat template understands; `developer` is OpenAI's newer name for `system`.
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
COMPLETION_DEFAULT_MAX_TOKENS = 16  # OpenAI's legacy default for /v1/completions
# chat without a limit: the gateway's default_max_tokens, never the whole context, so nobody gets a 2k-token bill
CHAT_DEFAULT_MAX_TOKENS = 512
MAX_PRIORITY = 2**31


class Endpoint(Enum):
    CHAT = "chat"
    COMPLETION = "completion"


@dataclass(slots=True)
class ValidatedRequest:
    """One validated request; exactly one of `prompt` (completions) and `messages` (chat) is set.

    `sampling` holds only the sampling fields the client set; the model's generation defaults fill the rest
    (`sampling_params`)."""

    endpoint: Endpoint
    model: str
    prompt: str | list[int] | None = None
    messages: list[dict[str, Any]] | None = None
    stream: bool = False
    include_usage: bool = False
    max_tokens: int | None = None
    n: int = 1
    sampling: dict[str, Any] = field(default_factory=dict)
    priority: int = 0
    cache_salt: str | None = None
    constraint: Constraint | None = None  # structured output (response_format, structured_outputs, guided_*)
    tools: ToolRequest | None = None

    @property
    def output_constraint(self) -> Constraint | None:
        """What the output must match: a forced tool call's grammar, else the request's own constraint."""
        return self.tools.constraint() if self.tools is not None and self.tools.forced else self.constraint

    def sampling_params(self, max_tokens: int, defaults: dict[str, Any] | None = None) -> SamplingParams:
        """The engine's parameters: the fields this request set, over the model's `defaults`."""
        return sampling_params(self.sampling, defaults or {}, max_tokens)


def decode_body(raw: bytes, max_depth: int) -> dict[str, Any]:
    """The body as a JSON object; invalid UTF-8, malformed JSON, NaN, nesting past `max_depth` and non-objects
    are 400s (`json_too_deep` for the nesting, as at the gateway)."""
    try:
        raw.decode("utf-8")  # json.loads would guess UTF-16 or -32 from the first bytes; OpenAI's bodies are UTF-8
    except UnicodeDecodeError as exc:
        raise invalid(f"request body is not valid UTF-8 (byte {exc.start})", code="invalid_encoding") from None
    body = decode_json(raw, max_depth=max_depth, allow_nan=False, invalid_code="invalid_json")
    if not isinstance(body, dict):
        raise invalid(f"request body must be a JSON object, not {type(body).__name__}", code="invalid_json")
    return body


def parse_request(body: dict[str, Any], endpoint: Endpoint) -> ValidatedRequest:
    """Validate every field this server reads; refuse the OpenAI features it does not implement."""
    _refuse_unsupported(body, endpoint)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise invalid("`model` is required and must be a non-empty string", "model")
    req = ValidatedRequest(endpoint=endpoint, model=model)
    if endpoint is Endpoint.CHAT:
        req.messages = _messages(body.get("messages"))
    else:
        req.prompt = _prompt(body.get("prompt"))
    # both endpoints: max_completion_tokens wins, as OpenAI's chat says, so no client gets more than it asked for
    max_tokens = int_field(body, "max_completion_tokens", lo=1)
    req.max_tokens = max_tokens if max_tokens is not None else int_field(body, "max_tokens", lo=1)
    req.n = body.get("n") or 1
    req.stream = bool_field(body, "stream")
    req.include_usage = _stream_options(body, req.stream)
    req.sampling = read_sampling(body, chat=endpoint is Endpoint.CHAT)
    min_tokens = req.sampling.get("min_tokens", 0)
    if req.max_tokens is not None and min_tokens > req.max_tokens:
        raise invalid(f"`min_tokens` ({min_tokens}) must not exceed `max_tokens` ({req.max_tokens})",
                      "min_tokens")
    req.priority = int_field(body, "priority", lo=-MAX_PRIORITY, hi=MAX_PRIORITY) or 0
    req.cache_salt = str_or_none(body, "cache_salt")
    _structured_fields(req, body)
    str_or_none(body, "user")  # accepted for tracing by the caller; only its type matters here
    return req


def check_token_ids(ids: list[int], vocab_size: int, param: str) -> None:
    bad = next((t for t in ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise invalid(f"token id {bad} in `{param}` is outside the vocabulary [0, {vocab_size})", param)


def resolve_max_tokens(req: ValidatedRequest, prompt_len: int, max_model_len: int) -> int:
    """The completion budget; prompt plus max_tokens beyond the context window is a 400, as in OpenAI."""
    param = "messages" if req.endpoint is Endpoint.CHAT else "prompt"
    if prompt_len == 0:
        raise invalid(f"`{param}` is empty after tokenization", param)
    room = max_model_len - prompt_len
    if req.max_tokens is None:
        wanted = COMPLETION_DEFAULT_MAX_TOKENS if req.endpoint is Endpoint.COMPLETION else CHAT_DEFAULT_MAX_TOKENS
        wanted = min(wanted, room)
    else:
        wanted = req.max_tokens
    if room < 1 or wanted > room:
        asked = prompt_len + max(wanted, 1)
        raise invalid(
            f"This model's maximum context length is {max_model_len} tokens. However, you requested {asked} "
            f"tokens ({prompt_len} in the {param}, {max(wanted, 1)} in the completion). "
            f"Please reduce the length of the {param} or completion.",
            param if room < 1 or req.max_tokens is None else "max_tokens", "context_length_exceeded")
    return wanted


# Fields this server refuses when set to anything but their neutral value (OpenAI default).
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "echo": (None, False), "suffix": (None, ""),
    "functions": (None, []), "function_call": (None, "none", "auto"),
    "prompt_logprobs": (None, 0),
}


def _refuse_unsupported(body: dict[str, Any], endpoint: Endpoint) -> None:
    n = body.get("n")
    if n is not None:
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise invalid(f"`n` must be an integer >= 1, got {n!r}", "n")
        if n > MAX_CHOICES:
            raise invalid(f"`n` must be at most {MAX_CHOICES}, got {n}", "n")
    best_of = body.get("best_of")
    if best_of is not None and best_of not in (1, n or 1):  # no choosing among more choices than returned
        raise unsupported("best_of", f"= {json.dumps(best_of)[:40]} (only best_of equal to n)")
    for name, neutral in _NEUTRAL.items():
        value = body.get(name)
        if not _is_neutral(value, neutral):
            raise unsupported(name, f"= {json.dumps(value)[:80]}")
    if endpoint is Endpoint.COMPLETION and body.get("tools") not in (None, []):
        raise unsupported("tools", "on /v1/completions (use /v1/chat/completions)")


def _structured_fields(req: ValidatedRequest, body: dict[str, Any]) -> None:
    req.constraint = parse_constraint(body)
    req.tools = parse_tools(body) if req.endpoint is Endpoint.CHAT else None
    if req.tools is not None and req.tools.forced and req.constraint is not None:
        raise invalid(f"`{req.constraint.field}` cannot be combined with `tool_choice` {req.tools.choice}",
                      req.constraint.field)
    if req.output_constraint is not None and req.sampling.get("min_tokens"):
        raise invalid("`min_tokens` cannot be combined with an output constraint", "min_tokens")


def _is_neutral(value: Any, neutral: tuple[Any, ...]) -> bool:
    if value is None:
        return True
    if isinstance(value, bool):  # True == 1 in Python; a flag is neutral only when False
        return value is False and any(n is False for n in neutral)
    return any(n is not None and not isinstance(n, bool) and value == n for n in neutral)


def _messages(value: Any) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise invalid("`messages` is required and must be a list of messages", "messages")
    if not value:
        raise invalid("`messages` must hold at least one message", "messages")
    out = []
    for i, msg in enumerate(value):
        where = f"messages[{i}]"
        if not isinstance(msg, dict):
            raise invalid(f"`{where}` must be an object with `role` and `content`", where)
        role = msg.get("role")
        if role == "tool" or (role == "assistant" and msg.get("tool_calls") is not None):
            out.append(chat_message(msg, where))
            continue
        if not isinstance(role, str) or role not in ROLES:
            known = ", ".join(sorted([*ROLES, "tool"]))
            raise invalid(f"`{where}.role` must be one of {known}; got {role!r}", f"{where}.role")
        out.append({"role": ROLES[role], "content": _content(msg.get("content"), role, where)})
    return out


def _content(value: Any, role: str, where: str) -> str:
    if isinstance(value, str):
        return utf8(value, f"{where}.content")
    if value is None and role == "assistant":
        return ""
    if isinstance(value, list):
        texts = []
        for j, part in enumerate(value):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise invalid(f"`{where}.content[{j}]` must be a text part {{\"type\": \"text\", \"text\": ...}}; "
                              "other content types are not supported", f"{where}.content")
            texts.append(utf8(part["text"], f"{where}.content"))
        return "\n".join(texts)
    raise invalid(f"`{where}.content` must be a string or a list of text parts", f"{where}.content")


def _prompt(value: Any) -> str | list[int]:
    # A batch of one ([text] or [[ids]]) is the same request as its single member.
    if isinstance(value, list) and len(value) == 1 and isinstance(value[0], str | list):
        value = value[0]
    if isinstance(value, str):
        if not value:
            raise invalid("`prompt` must not be empty", "prompt")
        return utf8(value, "prompt")
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return list(value)
    if isinstance(value, list) and len(value) > 1 and all(isinstance(p, str | list) for p in value):
        raise unsupported("prompt", "as a batch of several prompts")
    raise invalid("`prompt` is required: a non-empty string or a non-empty list of token ids", "prompt")


def _stream_options(body: dict[str, Any], stream: bool) -> bool:
    opts = body.get("stream_options")
    if opts is None:
        return False
    if not stream:
        raise invalid("`stream_options` is only allowed when `stream` is true", "stream_options")
    if not isinstance(opts, dict):
        raise invalid("`stream_options` must be an object", "stream_options")
    include = opts.get("include_usage", False)
    if not isinstance(include, bool):
        raise invalid("`stream_options.include_usage` must be a boolean", "stream_options.include_usage")
    return include
