"""A batch's input file read into its lines: each non-blank line is one request `{"custom_id", "method": "POST",
"url", "body"}` for the batch's endpoint. A line that is not one is reported in the batch's error file, never
refused as a whole, so the other lines still run; reading the same file again gives the same lines."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from gateway.batch.shapes import Doc, new_id

MAX_CUSTOM_ID = 512


@dataclass(slots=True)
class Line:
    index: int  # the line's place among the file's non-blank lines
    custom_id: str
    body: dict[str, Any]


@dataclass(slots=True)
class ReadLines:
    lines: list[Line] = field(default_factory=list)
    errors: dict[int, Doc] = field(default_factory=dict)  # index -> the error file's line for it

    @property
    def total(self) -> int:
        return len(self.lines) + len(self.errors)


def read_lines(content: bytes, endpoint: str, max_line_bytes: int) -> ReadLines:
    read = ReadLines()
    seen: set[str] = set()
    raw_lines = [raw for raw in content.split(b"\n") if raw.strip()]
    for index, raw in enumerate(raw_lines):
        custom_id, problem = _custom_id(raw), None
        if len(raw) > max_line_bytes:
            problem = ("line_too_large", f"the line is longer than {max_line_bytes} bytes")
        else:
            line, problem = _parse(raw, index, endpoint)
            if line is not None and line.custom_id in seen:
                problem = ("duplicate_custom_id", f"the custom_id {line.custom_id!r} is used twice")
            elif line is not None:
                seen.add(line.custom_id)
                read.lines.append(line)
        if problem is not None:
            read.errors[index] = error_line(custom_id, problem[0], f"line {index + 1}: {problem[1]}")
    return read


def error_line(custom_id: str | None, code: str, message: str, response: Doc | None = None) -> Doc:
    """A line of the error file, in OpenAI's shape."""
    return {"id": new_id("batch_req_"), "custom_id": custom_id, "response": response,
            "error": {"code": code, "message": message}}


def _parse(raw: bytes, index: int, endpoint: str) -> tuple[Line | None, tuple[str, str] | None]:
    try:
        request = json.loads(raw)
    except (ValueError, RecursionError):
        return None, ("invalid_json", "the line is not valid JSON")
    if not isinstance(request, dict):
        return None, ("invalid_request", "the line must be a JSON object")
    custom_id = request.get("custom_id")
    if not isinstance(custom_id, str) or not custom_id or len(custom_id) > MAX_CUSTOM_ID:
        return None, ("missing_custom_id", f"'custom_id' must be a string of 1 to {MAX_CUSTOM_ID} characters")
    if request.get("method", "POST") != "POST":
        return None, ("invalid_method", "'method' must be POST")
    if request.get("url") != endpoint:
        return None, ("mismatched_url", f"'url' must be the batch's endpoint {endpoint}")
    body = request.get("body")
    if not isinstance(body, dict):
        return None, ("invalid_body", "'body' must be a JSON object")
    if not isinstance(body.get("model"), str) or not body["model"]:
        return None, ("missing_model", "'body.model' must be a model name")
    # a batch line is answered whole: a stream has nobody to read it
    body = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    return Line(index, custom_id, body), None


def _custom_id(raw: bytes) -> str | None:
    """The line's custom_id, when one can be read, for the error file."""
    try:
        value = json.loads(raw).get("custom_id")
    except (ValueError, AttributeError, RecursionError):
        return None
    return value if isinstance(value, str) else None
