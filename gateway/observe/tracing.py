"""OpenTelemetry traces for the gateway: one span per request, children for admission, queue wait and attempts.

`setup_tracing(settings.tracing)` returns a `Tracing`. When the exporter is `off` it installs nothing and every
helper returns a shared no-op, so the hot path pays one attribute check. Spans get their parent passed
explicitly rather than through context variables, because a streamed response ends in a different task than
the one that started it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import (
    SpanExporter,
)
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from common.telemetry import (
    INSTRUMENTATION,
    extract_context,
    inject_traceparent,
    tracer_provider,
)
from config.gateway import Tracing as TracingSettings


class RequestTrace:
    """The span of one gateway request and its children; `NOOP_REQUEST` stands in when tracing is off."""

    __slots__ = ("_attempts", "_span", "_tracer")

    def __init__(self, tracer: Tracer, span: Span) -> None:
        self._tracer = tracer
        self._span = span
        self._attempts = 0

    @property
    def span(self) -> Span:
        return self._span

    def set(self, **attributes: Any) -> None:
        """Sets `tidegate.<name>` attributes, skipping None (an unknown key id is not an empty string)."""
        for name, value in attributes.items():
            if value is not None:
                self._span.set_attribute(f"tidegate.{name}", value)

    def set_key(self, key_id: str, account_id: str, sub_account_id: str | None) -> None:
        self.set(key_id=key_id, account_id=account_id, sub_account_id=sub_account_id)

    def set_model(self, model: str) -> None:
        self._span.set_attribute("gen_ai.request.model", model)

    def set_usage(self, prompt_tokens: int, completion_tokens: int) -> None:
        self._span.set_attribute("gen_ai.usage.input_tokens", prompt_tokens)
        self._span.set_attribute("gen_ai.usage.output_tokens", completion_tokens)

    def admission(self) -> AbstractContextManager[Span]:
        """Wraps the quota check-and-reserve; set `tidegate.refused_level` and `.refused_limit` on refusal."""
        return self._child("gateway.admission", SpanKind.INTERNAL, {})

    def queue_wait(self, priority_class: str) -> AbstractContextManager[Span]:
        """Wraps the wait for a slot in the priority class's pool."""
        return self._child("gateway.queue_wait", SpanKind.INTERNAL, {"tidegate.priority_class": priority_class})

    def upstream_attempt(
        self, channel: str, upstream_model: str, headers: MutableMapping[str, str]
    ) -> AbstractContextManager[Span]:
        """Wraps one upstream call and writes its `traceparent` into `headers`, so the backend joins the trace.

        The attempt counter lands on the request span; the caller sets `http.response.status_code` on the
        yielded span when the upstream answers. An exception marks the attempt as an error and propagates.
        """
        self._attempts += 1
        self._span.set_attribute("tidegate.attempts", self._attempts)
        self._span.set_attribute("tidegate.channel", channel)
        attributes = {"tidegate.channel": channel, "tidegate.attempt": self._attempts,
                      "gen_ai.request.model": upstream_model}
        return self._child("gateway.upstream_attempt", SpanKind.CLIENT, attributes, headers)

    def end(self, status_code: int, error_type: str | None = None) -> None:
        """Ends the request span with the status the client saw; call once, when the last byte is sent."""
        self._span.set_attribute("http.response.status_code", status_code)
        if status_code >= 500 or error_type:
            if error_type:
                self._span.set_attribute("error.type", error_type)
            self._span.set_status(Status(StatusCode.ERROR))
        self._span.end()

    @contextmanager
    def _child(
        self, name: str, kind: SpanKind, attributes: dict[str, Any], headers: MutableMapping[str, str] | None = None
    ) -> Iterator[Span]:
        # Not attached as the current span: the block may end in another task (a cancelled stream).
        span = self._tracer.start_span(name, context=trace.set_span_in_context(self._span), kind=kind,
                                       attributes=attributes)
        if headers is not None:
            inject_traceparent(span, headers)
        try:
            yield span
        except BaseException as exc:
            span.record_exception(exc)
            span.set_status(Status(StatusCode.ERROR, type(exc).__name__))
            raise
        finally:
            span.end()


class _NoopRequestTrace(RequestTrace):
    """Every method returns at once; upstream headers are left untouched."""

    __slots__ = ("_nothing",)

    def __init__(self) -> None:
        super().__init__(trace.NoOpTracer(), trace.INVALID_SPAN)
        # One reusable context for every child "span": no generator is built per call.
        self._nothing: AbstractContextManager[Span] = nullcontext(trace.INVALID_SPAN)

    def set(self, **attributes: Any) -> None:
        return None

    def set_key(self, key_id: str, account_id: str, sub_account_id: str | None) -> None:
        return None

    def set_model(self, model: str) -> None:
        return None

    def set_usage(self, prompt_tokens: int, completion_tokens: int) -> None:
        return None

    def admission(self) -> AbstractContextManager[Span]:
        return self._nothing

    def queue_wait(self, priority_class: str) -> AbstractContextManager[Span]:
        return self._nothing

    def upstream_attempt(
        self, channel: str, upstream_model: str, headers: MutableMapping[str, str]
    ) -> AbstractContextManager[Span]:
        return self._nothing

    def end(self, status_code: int, error_type: str | None = None) -> None:
        return None


NOOP_REQUEST: RequestTrace = _NoopRequestTrace()


class Tracing:
    """The gateway's tracer, or nothing at all when tracing is off."""

    __slots__ = ("_provider", "_tracer")

    def __init__(self, provider: TracerProvider | None) -> None:
        self._provider = provider
        self._tracer = provider.get_tracer(INSTRUMENTATION) if provider else None

    @property
    def enabled(self) -> bool:
        return self._tracer is not None

    def start_request(
        self, method: str, route: str, request_id: str, headers: Mapping[str, str] | None = None
    ) -> RequestTrace:
        """Starts the span of one client request, continuing the client's trace when it sent `traceparent`."""
        if self._tracer is None:
            return NOOP_REQUEST
        parent = extract_context(headers) if headers else None
        span = self._tracer.start_span(
            f"{method} {route}",
            context=parent,
            kind=SpanKind.SERVER,
            attributes={"http.request.method": method, "http.route": route, "common.request_id": request_id},
        )
        return RequestTrace(self._tracer, span)

    def shutdown(self) -> None:
        """Flushes pending spans; call on gateway shutdown."""
        if self._provider is not None:
            self._provider.shutdown()


def setup_tracing(settings: TracingSettings, exporter: SpanExporter | None = None) -> Tracing:
    """The gateway's tracing per `settings` (off, console or OTLP); tests pass an in-memory `exporter`."""
    return Tracing(tracer_provider(settings, exporter))
