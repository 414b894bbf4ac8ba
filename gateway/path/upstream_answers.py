"""A whole (non-streamed) upstream answer as the client gets it: a 2xx body charged by its usage (estimated when
the upstream sent none), or an upstream's refusal rewritten into the OpenAI error shape.

An upstream's error body is not the gateway's to pass on: it may be HTML, or carry the channel's API key or an
internal URL. Only its `code` and `param` are kept, and its `message` only when it is short plain text.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from gateway.errors import ApiError
from gateway.path.admission import estimate_completion_tokens
from gateway.path.relay import rewrite_body
from gateway.path.upstream import Answer
from gateway.records import Usage

MAX_MESSAGE = 400
IDENTIFIER = re.compile(r"[A-Za-z0-9_.\-\[\]]{1,64}")
# what a message must not carry: markup, URLs and host:port pairs, paths, and anything shaped like a credential
UNSAFE_MESSAGE = re.compile(
    r"[<>]|://|www\.|\b\d{1,3}(\.\d{1,3}){3}\b|\b[\w.-]+:\d{2,5}\b|(^|\s)/\w[\w.-]*/"
    r"|\b(sk|pk|rk|tg|key|api|token)[-_][A-Za-z0-9_-]{6,}|[A-Za-z0-9+/_=-]{32,}"
    r"|bearer|authorization|api[_ -]?key|password|secret|token=",
    re.IGNORECASE,
)


@dataclass(slots=True)
class ClientAnswer:
    status: int
    body: bytes
    usage: Usage | None  # None: nothing was served, nothing to charge


def client_answer(answer: Answer, prompt_tokens: int, generates: bool = True) -> ClientAnswer:
    """`generates`: false for an answer that has no completion tokens to estimate (an embedding)."""
    if answer.status >= 300:
        error = upstream_refusal(answer.status, answer.body)
        return ClientAnswer(error.status, _encode(error), None)
    body, reported = rewrite_body(answer)
    if is_reported(reported):
        return ClientAnswer(answer.status, body, reported)
    served = _json_object(body)
    if served is None:
        error = ApiError(502, "the upstream's answer is not a JSON object", "upstream_error", "upstream_error")
        return ClientAnswer(502, _encode(error), None)
    completion = estimate_completion_tokens(served) if generates else 0
    return ClientAnswer(answer.status, body, Usage(prompt_tokens, completion))


def is_reported(usage: Usage | None) -> bool:
    """Whether an upstream reported usage; all zeros for a served answer is an upstream that did not count."""
    return usage is not None and (usage.prompt_tokens > 0 or usage.completion_tokens > 0)


def upstream_refusal(status: int, body: bytes) -> ApiError:
    """An upstream's non-2xx answer as a safe OpenAI error. A 401/403 says the channel's credentials are wrong,
    which is the operator's problem, not the client's: it becomes a 502."""
    error = _json_object(body)
    detail = error.get("error") if error is not None else None
    fields: dict[str, Any] = detail if isinstance(detail, dict) else {}
    if status in (401, 403) or not 400 <= status < 500:
        return ApiError(502, f"the upstream failed (HTTP {status})", "upstream_error", "upstream_error")
    message = fields.get("message")
    safe = message if isinstance(message, str) and is_safe_message(message) else None
    return ApiError(status, safe or f"the upstream refused the request (HTTP {status})", "invalid_request_error",
                    _identifier(fields.get("code")), _identifier(fields.get("param")))


def is_safe_message(message: str) -> bool:
    return (0 < len(message) <= MAX_MESSAGE and message.isprintable()
            and UNSAFE_MESSAGE.search(message) is None)


def _identifier(value: object) -> str | None:
    return value if isinstance(value, str) and IDENTIFIER.fullmatch(value) else None


def _json_object(body: bytes) -> dict[str, Any] | None:
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return None
    return value if isinstance(value, dict) else None


def _encode(error: ApiError) -> bytes:
    return json.dumps(error.body(), separators=(",", ":")).encode()
