"""OpenTelemetry spans for a backend request, built after the fact from the engine's per-request timings.

The engine stamps each request with `time.monotonic()` (queued, scheduled, first token, finished); the server
calls `BackendTracing.record(...)` once with the final delta, and the spans (queue, prefill, decode under one
request span) are emitted with those times, joined to the gateway's trace through the `traceparent` header.
Nothing runs in the engine's step loop.
"""

from __future__ import annotations

import time
from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SpanExporter
from opentelemetry.trace import SpanKind, Status, StatusCode, Tracer

from backend.engine.records import RequestTimings
from common.telemetry import INSTRUMENTATION, extract_context, tracer_provider
from config.gateway import Tracing as TracingSettings


def _epoch_ns(monotonic_s: float, offset_ns: int) -> int:
    return int(monotonic_s * 1e9) + offset_ns


class BackendTracing:
    """The backend's tracer; `record` does nothing when tracing is off."""

    __slots__ = ("_provider", "_tracer")

    def __init__(self, provider: TracerProvider | None) -> None:
        self._provider = provider
        self._tracer: Tracer | None = provider.get_tracer(INSTRUMENTATION) if provider else None

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def record(
        self,
        headers: Mapping[str, str],
        *,
        route: str,
        request_id: str,
        model: str,
        timings: RequestTimings,
        prompt_tokens: int,
        completion_tokens: int,
        cached_tokens: int = 0,
        finish_reason: str | None = None,
        status_code: int = 200,
    ) -> None:
        """Emits `POST <route>` with children `engine.queue`, `engine.prefill`, `engine.decode`.

        `headers` are the HTTP request's headers (their `traceparent` is the parent). Call when the request
        ends, however it ends; phases the request never reached (an abort while queued) are left out.
        """
        if self._tracer is None:
            return
        offset_ns = time.time_ns() - time.monotonic_ns()
        finished = timings.finished if timings.finished is not None else time.monotonic()
        request = self._tracer.start_span(
            f"POST {route}",
            context=extract_context(headers),
            kind=SpanKind.SERVER,
            start_time=_epoch_ns(timings.queued, offset_ns),
            attributes={
                "http.request.method": "POST",
                "http.route": route,
                "http.response.status_code": status_code,
                "common.request_id": request_id,
                "gen_ai.request.model": model,
                "gen_ai.usage.input_tokens": prompt_tokens,
                "gen_ai.usage.output_tokens": completion_tokens,
                "tidegate.cached_tokens": cached_tokens,
                "tidegate.num_preemptions": timings.num_preemptions,
            },
        )
        if finish_reason is not None:
            request.set_attribute("gen_ai.response.finish_reasons", [finish_reason])
        if status_code >= 500 or finish_reason == "abort":
            request.set_status(Status(StatusCode.ERROR, finish_reason or str(status_code)))
        parent = trace.set_span_in_context(request)
        # Each phase ends where the next begins; a phase never reached ends the chain.
        phases = [
            ("engine.queue", timings.queued, timings.scheduled),
            ("engine.prefill", timings.scheduled, timings.first_token),
            ("engine.decode", timings.first_token, finished),
        ]
        for name, start, end in phases:
            if start is None:
                break
            span = self._tracer.start_span(name, context=parent, start_time=_epoch_ns(start, offset_ns))
            if name == "engine.prefill":
                span.set_attribute("tidegate.prefill_tokens", prompt_tokens - cached_tokens)
            elif name == "engine.decode":
                span.set_attribute("tidegate.decode_tokens", completion_tokens)
            span.end(end_time=_epoch_ns(end if end is not None else finished, offset_ns))
        request.end(end_time=_epoch_ns(finished, offset_ns))

    def shutdown(self) -> None:
        """Flushes pending spans; call on server shutdown."""
        if self._provider is not None:
            self._provider.shutdown()


def setup_backend_tracing(settings: TracingSettings, exporter: SpanExporter | None = None) -> BackendTracing:
    """The backend's tracing per `settings`; its service name defaults to `tidegate-backend`."""
    if "service_name" not in settings.model_fields_set:
        settings = settings.model_copy(update={"service_name": "tidegate-backend"})
    return BackendTracing(tracer_provider(settings, exporter))
