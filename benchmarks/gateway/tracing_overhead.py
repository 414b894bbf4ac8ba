"""What tracing adds to one gateway request: the span helpers' cost with tracing off, on, and not called at all.

Runs the calls the gateway makes per request (request span, key and model attributes, admission, queue wait,
one upstream attempt with traceparent injection, usage, end) in a tight loop and reports CPU time per request
(not wall time, so other work on the machine does not inflate it); spans go through the batch processor to an
in-memory exporter (no I/O) when tracing is on.

    .venv/bin/python -m benchmarks.gateway.tracing_overhead --requests 100000
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from config.gateway import Tracing as TracingSettings
from gateway.observe.tracing import Tracing, setup_tracing


def _baseline() -> None:
    # The same header dict the gateway builds for its upstream call, without tracing.
    headers = {"content-type": "application/json"}
    headers.get("traceparent")


def _traced(tracing: Tracing) -> Callable[[], None]:
    def one_request() -> None:
        request = tracing.start_request("POST", "/v1/chat/completions", "req")
        request.set_key("key_1", "acct_1", "sub_1")
        request.set_model("smollm2")
        with request.admission():
            pass
        with request.queue_wait("realtime"):
            pass
        headers = {"content-type": "application/json"}
        with request.upstream_attempt("local-1", "smollm2", headers):
            pass
        request.set_usage(20, 8)
        request.end(200)

    return one_request


def ns_per_request(fn: Callable[[], None], requests: int) -> float:
    for _ in range(min(requests, 1000)):  # warm up
        fn()
    start = time.process_time_ns()
    for _ in range(requests):
        fn()
    return (time.process_time_ns() - start) / requests


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=100_000)
    args = parser.parse_args(argv)
    # Batched as in production (console and OTLP), into memory so that no I/O is timed.
    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(InMemorySpanExporter()))
    on = Tracing(provider)
    results = {
        "requests": args.requests,
        "baseline_ns": ns_per_request(_baseline, args.requests),
        "off_ns": ns_per_request(_traced(setup_tracing(TracingSettings(exporter="off"))), args.requests),
        # Fewer rounds when on: every span is kept by the in-memory exporter.
        "on_in_memory_ns": ns_per_request(_traced(on), max(1, args.requests // 10)),
    }
    provider.shutdown()
    print(json.dumps({k: round(v, 1) if isinstance(v, float) else v for k, v in results.items()}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
