"""Gateway traces: the request span and its children, traceparent sent upstream, tracing off costs nothing."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from common.telemetry import otlp_traces_url
from config.gateway import Tracing as TracingSettings
from gateway.observe.tracing import NOOP_REQUEST, setup_tracing
from tests.gateway.live_stack import ADMIN_KEY, live_stack
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
        "common.request_id": "req-7",
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
    assert root.attributes["common.request_id"] == "req-otlp"


def test_one_request_through_gateway_and_backend_is_one_trace(tmp_path: Path, model_path: Path) -> None:
    with running_collector() as collector:
        otlp = {"exporter": "otlp", "otlp_endpoint": collector.endpoint}
        env = {"OTEL_BSP_SCHEDULE_DELAY": "50",  # export within 50 ms, not 5 s
               "TIDEGATE_BACKEND__TRACING__EXPORTER": "otlp",
               "TIDEGATE_BACKEND__TRACING__OTLP_ENDPOINT": collector.endpoint}
        with live_stack(tmp_path, model_path, gateway={"tracing": otlp}, env=env) as stack:
            admin = httpx.Client(base_url=stack.url, headers={"authorization": f"Bearer {ADMIN_KEY}"})
            account = admin.post("/admin/accounts", json={"name": "traced"}).json()
            created = admin.post("/admin/keys", json={"account_id": account["id"], "name": "k"}).json()
            completion = stack.client(created["key"]).chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)
            spans = collector.wait_for(lambda spans: {"engine.decode", "POST /v1/chat/completions"}
                                       <= {s.name for s in spans} and len(spans) >= 8)

    assert completion.usage is not None
    assert len({s.trace_id for s in spans}) == 1
    gateway = {s.name: s for s in spans if s.service == "tidegate-gateway"}
    backend = {s.name: s for s in spans if s.service == "tidegate-backend"}
    assert sorted(gateway) == ["POST /v1/chat/completions", "gateway.admission", "gateway.queue_wait",
                               "gateway.upstream_attempt"]
    assert sorted(backend) == ["POST /v1/chat/completions", "engine.decode", "engine.prefill", "engine.queue"]
    root, attempt = gateway["POST /v1/chat/completions"], gateway["gateway.upstream_attempt"]
    assert root.parent_span_id == ""
    assert {s.parent_span_id for n, s in gateway.items() if n != root.name} == {root.span_id}
    # The backend's request hangs under the attempt that reached it, across the process boundary.
    assert backend["POST /v1/chat/completions"].parent_span_id == attempt.span_id
    assert {backend[n].parent_span_id for n in ("engine.queue", "engine.prefill", "engine.decode")} == {
        backend["POST /v1/chat/completions"].span_id}
    assert root.attributes["tidegate.key_id"] == created["id"]
    assert root.attributes["tidegate.account_id"] == account["id"]
    assert root.attributes["gen_ai.request.model"] == "smollm2"
    assert root.attributes["tidegate.channel"] == "local-1"
    assert root.attributes["tidegate.attempts"] == 1
    assert root.attributes["gen_ai.usage.input_tokens"] == completion.usage.prompt_tokens
    assert root.attributes["gen_ai.usage.output_tokens"] == completion.usage.completion_tokens == 3
    assert root.attributes["http.response.status_code"] == 200
    assert backend["POST /v1/chat/completions"].attributes["gen_ai.usage.output_tokens"] == 3
    # Time nests: the backend's work lies inside the attempt, the attempt inside the request.
    assert root.start_ns <= attempt.start_ns <= backend["engine.queue"].start_ns
    assert backend["engine.decode"].end_ns <= root.end_ns
