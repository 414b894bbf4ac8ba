"""The per-request log line: written once, as one JSON object, with a safe request id."""

from __future__ import annotations

import json
import logging

import pytest

from backend.server.request_log import JsonLineFormatter, RequestLogLine


def test_the_record_is_written_once_as_json_with_its_timings(caplog: pytest.LogCaptureFixture) -> None:
    record = RequestLogLine("r1", "chat", prompt_tokens=5)
    record.token_seen()
    record.completion_tokens, record.finish_reason = 3, "stop"
    with caplog.at_level(logging.INFO, logger="tidegate.backend.requests"):
        record.write()
        record.write()
    assert len(caplog.records) == 1
    line = json.loads(caplog.records[0].getMessage())
    assert line["event"] == "request" and line["request_id"] == "r1" and line["status"] == 200
    assert (line["prompt_tokens"], line["completion_tokens"], line["finish_reason"]) == (5, 3, "stop")
    assert 0 <= line["ttft"] <= line["e2e"]
    assert "arrival" not in line and "_written" not in line


def test_failed_requests_are_logged_at_error_level_from_500(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO, logger="tidegate.backend.requests"):
        RequestLogLine("a", "completion", status=400).write()
        bad = RequestLogLine("b", "completion")
        bad.failed(500, "boom")
        bad.write()
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.ERROR]


def test_the_formatter_turns_every_record_into_one_json_line() -> None:
    fmt = JsonLineFormatter()
    plain = logging.LogRecord("tidegate.backend.server", logging.INFO, __file__, 1, "ready in %ss", (2,), None)
    assert json.loads(fmt.format(plain))["message"] == "ready in 2s"
    request = logging.LogRecord("tidegate.backend.requests", logging.INFO, __file__, 1, '{"event":"request"}',
                                None, None)
    line = json.loads(fmt.format(request))
    assert line["event"] == "request" and line["level"] == "info" and "\n" not in fmt.format(request)
