"""Backend traces: queue, prefill and decode spans from the engine's timings, joined to the gateway's trace."""

from __future__ import annotations

import time

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from backend.engine.records import RequestTimings
from backend.server.tracing import setup_backend_tracing
from config.gateway import Tracing as TracingSettings
from gateway.observe.tracing import setup_tracing


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in spans}


def test_backend_phases_join_the_gateway_attempt_with_the_engine_timings(exporter: InMemorySpanExporter) -> None:
    gateway_exporter, backend_exporter = exporter, InMemorySpanExporter()
    gateway = setup_tracing(TracingSettings(), exporter=gateway_exporter)
    backend = setup_backend_tracing(TracingSettings(), exporter=backend_exporter)
    request = gateway.start_request("POST", "/v1/chat/completions", "req-5")
    headers: dict[str, str] = {}
    with request.upstream_attempt("local-1", "smollm2", headers):
        now = time.monotonic()
        timings = RequestTimings(queued=now - 0.5, scheduled=now - 0.4, first_token=now - 0.3, finished=now - 0.1)
        backend.record(headers, route="/v1/chat/completions", request_id="cmpl-1", model="smollm2",
                       timings=timings, prompt_tokens=20, completion_tokens=8, cached_tokens=16,
                       finish_reason="length")
    request.end(200)

    attempt = by_name(gateway_exporter.get_finished_spans())["gateway.upstream_attempt"]
    spans = by_name(backend_exporter.get_finished_spans())
    root = spans["POST /v1/chat/completions"]
    assert root.resource.attributes["service.name"] == "tidegate-backend"
    assert root.context.trace_id == attempt.context.trace_id
    assert root.parent is not None and root.parent.span_id == attempt.context.span_id
    assert root.parent.is_remote
    assert root.attributes["gen_ai.usage.input_tokens"] == 20  # type: ignore[index]
    assert root.attributes["gen_ai.response.finish_reasons"] == ("length",)  # type: ignore[index]
    queue, prefill, decode = spans["engine.queue"], spans["engine.prefill"], spans["engine.decode"]
    assert {s.parent.span_id for s in (queue, prefill, decode)} == {root.context.span_id}  # type: ignore[union-attr]
    assert root.start_time == queue.start_time
    assert queue.end_time == prefill.start_time and prefill.end_time == decode.start_time
    assert decode.end_time == root.end_time
    durations_ms = [round((s.end_time - s.start_time) / 1e6) for s in (queue, prefill, decode)]  # type: ignore[operator]
    assert durations_ms == [100, 100, 200]
    assert prefill.attributes == {"tidegate.prefill_tokens": 4}
    assert decode.attributes == {"tidegate.decode_tokens": 8}
    # The wall clock of the backend's spans sits where the request really ran.
    assert abs(root.end_time - (time.time_ns() - 100_000_000)) < 50_000_000  # type: ignore[operator]


def test_request_aborted_while_queued_has_only_a_queue_span(exporter: InMemorySpanExporter) -> None:
    backend = setup_backend_tracing(TracingSettings(), exporter=exporter)
    now = time.monotonic()
    backend.record({}, route="/v1/completions", request_id="cmpl-2", model="smollm2",
                   timings=RequestTimings(queued=now - 1.0, finished=now), prompt_tokens=5, completion_tokens=0,
                   finish_reason="abort", status_code=200)
    spans = by_name(exporter.get_finished_spans())
    assert sorted(spans) == ["POST /v1/completions", "engine.queue"]
    assert spans["POST /v1/completions"].parent is None
    assert spans["POST /v1/completions"].status.status_code == StatusCode.ERROR


def test_backend_tracing_off_records_nothing() -> None:
    backend = setup_backend_tracing(TracingSettings(exporter="off"))
    backend.record({}, route="/v1/completions", request_id="x", model="m",
                   timings=RequestTimings(queued=time.monotonic()), prompt_tokens=1, completion_tokens=0)
    assert not backend.enabled
