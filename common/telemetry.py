"""OpenTelemetry set-up and W3C trace-context propagation, shared by both tiers (which meet only over HTTP)."""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    ConsoleSpanExporter,
    SimpleSpanProcessor,
    SpanExporter,
)
from opentelemetry.trace import Span
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from config.gateway import Tracing as TracingSettings

_PROPAGATOR = TraceContextTextMapPropagator()
INSTRUMENTATION = "tidegate"


def tracer_provider(settings: TracingSettings, exporter: SpanExporter | None = None) -> TracerProvider | None:
    """A provider for the configured exporter, or None when tracing is off and no exporter is given.

    An explicit `exporter` (tests pass an InMemorySpanExporter) is flushed span by span; the console and OTLP
    exporters are batched so that exporting never blocks the event loop.
    """
    if exporter is None and settings.exporter == "off":
        return None
    provider = TracerProvider(resource=Resource.create({"service.name": settings.service_name}))
    if exporter is not None:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    elif settings.exporter == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    else:
        # Imported here: the OTLP exporter pulls in protobuf, which a gateway without OTLP never needs.
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=otlp_traces_url(settings))))
    return provider


def otlp_traces_url(settings: TracingSettings) -> str | None:
    """The OTLP/HTTP traces URL: the configured endpoint with `/v1/traces` added when it names only a host."""
    endpoint = settings.otlp_endpoint
    if endpoint is None or endpoint.rstrip("/").endswith("/v1/traces"):
        return endpoint
    return endpoint.rstrip("/") + "/v1/traces"


def inject_traceparent(span: Span, headers: MutableMapping[str, str]) -> MutableMapping[str, str]:
    """Writes W3C `traceparent` (and `tracestate`) for `span` into `headers` and returns them."""
    _PROPAGATOR.inject(headers, context=trace.set_span_in_context(span))
    return headers


def extract_context(headers: Mapping[str, str]) -> Context:
    """The remote parent carried by a request's `traceparent`, or an empty context when there is none."""
    return _PROPAGATOR.extract({k.lower(): v for k, v in headers.items()})
