"""Metrics of MCP tool calls through the gateway: counts by server, tool and outcome, and their latency."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

TOOL_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0)


class McpMetrics:
    """Labels are registered servers and the tools they list, never a name a client made up (`other`)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.calls = Counter("tidegate_mcp_calls", "MCP tool calls by server, tool and outcome",
                             ["server", "tool", "outcome"], registry=registry)
        self.seconds = Histogram("tidegate_mcp_call_seconds", "From a tool call's arrival to its answer, by server",
                                 ["server"], buckets=TOOL_BUCKETS, registry=registry)

    def called(self, server: str, tool: str, outcome: str, seconds: float) -> None:
        self.calls.labels(server, tool, outcome).inc()
        self.seconds.labels(server).observe(seconds)
