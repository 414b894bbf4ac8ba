"""One structured JSON log line per request: who it was, what it cost, how long each phase took, how it ended."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from typing import Any

log = logging.getLogger("tidegate.backend.requests")

CLIENT_GONE = 499  # nginx's "client closed request": no response was delivered


@dataclass(slots=True)
class RequestLogLine:
    """What the log line says about one request; filled in as the request goes, written once."""

    request_id: str
    endpoint: str
    response_id: str | None = None  # the engine's request id, as `chatcmpl-...`/`cmpl-...`
    stream: bool = False
    status: int = 200
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str | None = None
    queue_time: float | None = None
    ttft: float | None = None
    e2e: float | None = None
    error: str | None = None
    traceparent: str | None = None  # the W3C trace this request belongs to, to find its spans
    arrival: float = field(default_factory=time.monotonic)
    _written: bool = False

    def token_seen(self) -> None:
        if self.ttft is None:
            self.ttft = time.monotonic() - self.arrival

    def failed(self, status: int, message: str) -> None:
        self.status = status
        self.error = message

    def write(self) -> None:
        """Emit the line (only the first call counts, so every exit path may call it)."""
        if self._written:
            return
        self._written = True
        self.e2e = time.monotonic() - self.arrival
        fields = asdict(self)
        for private in ("arrival", "_written"):
            fields.pop(private)
        for key in ("queue_time", "ttft", "e2e"):
            if fields[key] is not None:
                fields[key] = round(fields[key], 4)
        level = logging.ERROR if self.status >= 500 else logging.INFO
        log.log(level, json.dumps({"event": "request", **fields}, separators=(",", ":")))


class JsonLineFormatter(logging.Formatter):
    """Every log record as one JSON object; request lines are already JSON and pass through whole."""

    def format(self, record: logging.LogRecord) -> str:
        message = record.getMessage()
        if record.name == log.name and message.startswith("{"):
            body: dict[str, Any] = json.loads(message)
        else:
            body = {"event": "log", "message": message}
            if record.exc_info:
                body["exc"] = self.formatException(record.exc_info)
        return json.dumps({"ts": round(record.created, 3), "level": record.levelname.lower(),
                           "logger": record.name, **body}, separators=(",", ":"))


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(JsonLineFormatter())
    root = logging.getLogger("tidegate")
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    root.propagate = False
