"""Gateway traces: the request span and its children, traceparent sent upstream, tracing off costs nothing."""

from __future__ import annotations

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from config.gateway import Tracing as TracingSettings
from gateway.tracing import NOOP_REQUEST, otlp_traces_url, setup_tracing
from tests.gateway.otlp_collector import running_collector


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


def by_name(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {span.name: span for span in spans}


def traceparent_of(span: ReadableSpan) -> str:
    ctx = span.get_span_context()
    return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"


def test_off_installs_nothing_and_leaves_upstream_headers_untouched() -> None:
    tracing = setup_tracing(TracingSettings(exporter="off"))
    request = tracing.start_request("POST", "/v1/chat/completions", "req-1", {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"})
    headers: dict[str, str] = {}
    with request.admission(), request.queue_wait("realtime"), request.upstream_attempt("local-1", "smollm2", headers):
        request.set_key("key-1", "acct-1", None)
        request.set_usage(3, 4)
    request.end(200)
    assert not tracing.enabled
    assert request is NOOP_REQUEST
    assert headers == {}
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)


def test_request_span_holds_key_account_model_channel_attempts_and_tokens(exporter: InMemorySpanExporter) -> None:
    tracing = setup_tracing(TracingSettings(exporter="off", service_name="gw-test"), exporter=exporter)
    request = tracing.start_request("POST", "/v1/chat/completions", "req-7")
    request.set_key("key-1", "acct-1", "sub-1")
    request.set_model("smollm2")
    with request.admission() as admission:
        admission.set_attribute("tidegate.admitted", True)
    with request.queue_wait("batch"):
        pass
    with pytest.raises(ConnectionError), request.upstream_attempt("down-1", "smollm2", {}):
        raise ConnectionError("refused")
    with request.upstream_attempt("local-1", "smollm2", {}) as attempt:
        attempt.set_attribute("http.response.status_code", 200)
    request.set_usage(12, 5)
    request.end(200)

    spans = exporter.get_finished_spans()
    named = by_name(spans)
    root = named["POST /v1/chat/completions"]
    assert root.parent is None
    assert root.resource.attributes["service.name"] == "gw-test"
    assert root.kind == trace.SpanKind.SERVER
    assert dict(root.attributes or {}) == {
        "http.request.method": "POST",
        "http.route": "/v1/chat/completions",
        "tidegate.request_id": "req-7",
        "tidegate.key_id": "key-1",
        "tidegate.account_id": "acct-1",
        "tidegate.sub_account_id": "sub-1",
        "gen_ai.request.model": "smollm2",
        "tidegate.attempts": 2,
        "tidegate.channel": "local-1",
        "gen_ai.usage.input_tokens": 12,
        "gen_ai.usage.output_tokens": 5,
        "http.response.status_code": 200,
    }
    assert root.status.status_code == StatusCode.UNSET
    children = [s for s in spans if s is not root]
    assert sorted(s.name for s in children) == [
        "gateway.admission", "gateway.queue_wait", "gateway.upstream_attempt", "gateway.upstream_attempt",
    ]
    assert all(s.parent is not None and s.parent.span_id == root.context.span_id for s in children)
    assert {s.context.trace_id for s in spans} == {root.context.trace_id}
    assert named["gateway.queue_wait"].attributes == {"tidegate.priority_class": "batch"}
    failed, succeeded = sorted((s for s in children if s.name == "gateway.upstream_attempt"),
                               key=lambda s: s.attributes["tidegate.attempt"])  # type: ignore[index]
    assert failed.status.status_code == StatusCode.ERROR
    assert failed.attributes["tidegate.channel"] == "down-1"  # type: ignore[index]
    assert [e.name for e in failed.events] == ["exception"]
    assert succeeded.attributes["http.response.status_code"] == 200  # type: ignore[index]
    assert succeeded.kind == trace.SpanKind.CLIENT


def test_each_attempt_sends_its_own_traceparent_upstream(exporter: InMemorySpanExporter) -> None:
    tracing = setup_tracing(TracingSettings(), exporter=exporter)
    request = tracing.start_request("POST", "/v1/completions", "req-2")
    sent: list[dict[str, str]] = []
    for channel in ("a", "b"):
        headers = {"content-type": "application/json"}
        with request.upstream_attempt(channel, "smollm2", headers):
            sent.append(headers)
    request.end(200)
    attempts = [s for s in exporter.get_finished_spans() if s.name == "gateway.upstream_attempt"]
    assert [h["traceparent"] for h in sent] == [traceparent_of(s) for s in attempts]
    assert sent[0]["traceparent"] != sent[1]["traceparent"]
    assert all(h["content-type"] == "application/json" for h in sent)


def test_client_traceparent_is_continued_and_server_errors_mark_the_span(exporter: InMemorySpanExporter) -> None:
    tracing = setup_tracing(TracingSettings(), exporter=exporter)
    client_trace, client_span = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    request = tracing.start_request("POST", "/v1/completions", "req-3",
                                    {"Traceparent": f"00-{client_trace}-{client_span}-01"})
    request.end(503, error_type="no_healthy_channel")
    (span,) = exporter.get_finished_spans()
    assert f"{span.context.trace_id:032x}" == client_trace
    assert span.parent is not None and f"{span.parent.span_id:016x}" == client_span
    assert span.status.status_code == StatusCode.ERROR
    assert span.attributes["error.type"] == "no_healthy_channel"  # type: ignore[index]


def test_malformed_client_traceparent_starts_a_fresh_trace(exporter: InMemorySpanExporter) -> None:
    tracing = setup_tracing(TracingSettings(), exporter=exporter)
    request = tracing.start_request("POST", "/v1/completions", "req-4", {"traceparent": "00-zz-not-a-trace"})
    request.end(200)
    (span,) = exporter.get_finished_spans()
    assert span.parent is None
    assert span.context.trace_id != 0


@pytest.mark.parametrize(
    ("endpoint", "url"),
    [
        (None, None),
        ("http://collector:4318", "http://collector:4318/v1/traces"),
        ("http://collector:4318/", "http://collector:4318/v1/traces"),
        ("http://collector:4318/v1/traces", "http://collector:4318/v1/traces"),
    ],
)
def test_otlp_endpoint_gets_the_traces_path(endpoint: str | None, url: str | None) -> None:
    assert otlp_traces_url(TracingSettings(exporter="otlp", otlp_endpoint=endpoint)) == url


def test_otlp_exporter_delivers_spans_to_a_collector_over_http() -> None:
    with running_collector() as collector:
        tracing = setup_tracing(TracingSettings(exporter="otlp", otlp_endpoint=collector.endpoint,
                                                service_name="gw-otlp"))
        request = tracing.start_request("POST", "/v1/completions", "req-otlp")
        with request.admission():
            pass
        request.end(200)
        tracing.shutdown()  # flushes the batch
        spans = collector.wait_for(lambda spans: len(spans) == 2)
    assert sorted((s.service, s.name) for s in spans) == [
        ("gw-otlp", "POST /v1/completions"), ("gw-otlp", "gateway.admission")]
    root = next(s for s in spans if s.name == "POST /v1/completions")
    assert root.attributes["tidegate.request_id"] == "req-otlp"
