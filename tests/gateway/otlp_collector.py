"""A minimal OTLP/HTTP traces receiver on loopback that keeps every span it is sent, in memory."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import uvicorn
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from tests.servers import free_port, wait_for_port


@dataclass(slots=True)
class ReceivedSpan:
    """One span as an exporter sent it, with its process's service name and attributes decoded."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    status_code: int


def _value(any_value: Any) -> Any:
    kind = any_value.WhichOneof("value")
    if kind == "array_value":
        return tuple(_value(v) for v in any_value.array_value.values)
    return getattr(any_value, kind) if kind else None


@dataclass
class OtlpCollector:
    port: int = field(default_factory=free_port)
    spans: list[ReceivedSpan] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def _receive(self, request: Request) -> Response:
        message = ExportTraceServiceRequest()
        message.ParseFromString(await request.body())
        for resource_spans in message.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                self.spans.extend(
                    ReceivedSpan(str(resource.get("service.name")), s.name, s.trace_id.hex(), s.span_id.hex(),
                                 s.parent_span_id.hex(), s.start_time_unix_nano, s.end_time_unix_nano,
                                 {a.key: _value(a.value) for a in s.attributes}, s.status.code)
                    for s in scope_spans.spans)
        return Response(b"", media_type="application/x-protobuf")

    def wait_for(self, done: Callable[[list[ReceivedSpan]], bool], timeout: float = 15.0) -> list[ReceivedSpan]:
        """The spans received once `done` holds for them; raises TimeoutError with what arrived otherwise."""
        deadline = time.monotonic() + timeout
        while not done(list(self.spans)):
            if time.monotonic() > deadline:
                raise TimeoutError(f"spans received: {[(s.service, s.name) for s in self.spans]}")
            time.sleep(0.05)
        return list(self.spans)


@contextmanager
def running_collector() -> Iterator[OtlpCollector]:
    """An OtlpCollector served by uvicorn in a thread for the duration of the block."""
    collector = OtlpCollector()
    app = Starlette(routes=[Route("/v1/traces", collector._receive, methods=["POST"])])
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=collector.port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        wait_for_port(collector.port)
        yield collector
    finally:
        server.should_exit = True
        thread.join(timeout=5)
