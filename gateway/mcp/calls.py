"""One tool call's way through the gateway, whichever API asked for it (/mcp or a Responses `mcp` tool): the key
may use the tool, the arguments fit, admission on `mcp:server__tool` (the key's RPM and concurrency like any
request), the relayed call with its trace context in `_meta`, then settlement, metrics and the audit line."""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import mcp_types as types
from mcp import MCPError
from opentelemetry import context as otel_context
from opentelemetry import trace as otel_trace

from gateway.errors import ApiError
from gateway.mcp.names import every_tool, may_use, model_name, split_name
from gateway.mcp.registry import McpRegistry
from gateway.mcp.upstream import Failure, McpUpstream, UpstreamFailure, arguments_size
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.tracing import Tracing
from gateway.path.admission import refusal
from gateway.path.exchange import Exchange
from gateway.records import Usage
from quota import KeyInfo, QuotaService

audit_log = logging.getLogger("tidegate.gateway.mcp.audit")
PATH = "/mcp"
TRACE_FIELDS = ("traceparent", "tracestate")
# JSON-RPC error codes of refusals the gateway makes itself (the implementation-defined server range); the
# error's data carries the HTTP status an OpenAI-style API would have answered, and Retry-After for a 429
UNKNOWN_TOOL = types.INVALID_PARAMS  # as MCP servers answer a name they do not have
TOOL_REFUSED = -32003
TOO_LARGE = -32013
RATE_LIMITED = -32029
UPSTREAM_FAILED = -32002
# how the call ended -> the status its exchange records (a tool's own isError is still a served call)
STATUS = {"ok": 200, "tool_error": 200, Failure.server_error.value: 502, Failure.too_large.value: 502,
          Failure.timeout.value: 504, Failure.unavailable.value: 503, Failure.breaker_open.value: 503}
# the call reached the server, so it is charged (a timed-out call may still have run there)
CHARGED = {"ok", "tool_error", Failure.server_error.value, Failure.too_large.value, Failure.timeout.value}


@dataclass(slots=True)
class CallRefused(Exception):
    """A tool call the gateway answers itself: as an MCP error on /mcp, as an API error elsewhere."""

    status: int
    message: str
    code: int
    reason: str  # the OpenAI-style error code: tool_not_found, tool_not_allowed, rate_limit_exceeded, ...
    retry_after: float | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def mcp_error(self) -> MCPError:
        data: dict[str, Any] = {"status": self.status, "code": self.reason}
        if self.retry_after is not None:
            data["retry_after"] = self.retry_after
        return MCPError(self.code, self.message, data)


@dataclass(slots=True)
class ToolCall:
    key: KeyInfo
    name: str  # the public `server__tool`
    arguments: dict[str, Any] | None
    request_id: str
    headers: Mapping[str, str] = field(default_factory=dict)  # the client's, whose traceparent the call continues


@dataclass(slots=True)
class AdmittedCall:
    call: ToolCall
    upstream: McpUpstream
    tool: str
    exchange: Exchange
    started: float
    ended: bool = False


class McpCalls:
    def __init__(self, registry: McpRegistry, quota: QuotaService, metrics: GatewayMetrics, tracing: Tracing,
                 renew_interval: float) -> None:
        self.registry = registry
        self._quota = quota
        self._metrics = metrics
        self._tracing = tracing
        self._renew_interval = renew_interval

    async def tools_for(self, key: KeyInfo) -> list[tuple[McpUpstream, types.Tool]]:
        """Every tool of every registered server that the key may use, each server asked (or its cache read)."""
        servers = [u for u in self.registry.servers.values()  # never asked on behalf of an account it does not serve
                   if u.config.allowed_accounts is None or key.account_id in u.config.allowed_accounts]
        listings = await asyncio.gather(*(u.tools() for u in servers))  # a slow server delays only itself
        return [(upstream, tool) for upstream, tools in zip(servers, listings, strict=True) for tool in tools
                if may_use(key, upstream.config, tool.name)]

    async def call(self, call: ToolCall) -> types.CallToolResult:
        """The tool's result (its own errors included, as `isError`), or CallRefused."""
        return await self.run(await self.admit(call))

    async def admit(self, call: ToolCall) -> AdmittedCall:
        """The call checked (the tool exists, the key may use it, the arguments fit) and admitted on its quotas;
        CallRefused otherwise. An admitted call holds its reservation until `run` (or `release`) ends it."""
        started = time.monotonic()
        trace = self._tracing.start_request("POST", PATH, call.request_id, call.headers)
        exchange = Exchange(self._quota, self._metrics, call.request_id, PATH, self._renew_interval, trace)
        exchange.identify(call.key)
        exchange.record.model = call.name
        try:
            upstream, tool = await self._resolve(call)
        except CallRefused as refused:
            await exchange.end(refused.status, "refused")
            raise
        exchange.record.model, exchange.record.channel = model_name(upstream.name, tool), f"mcp:{upstream.name}"
        trace.set_model(exchange.record.model)
        admitted = AdmittedCall(call, upstream, tool, exchange, started)
        try:
            await self._admit(exchange, call.key, upstream, tool)
        except CallRefused as refused:
            await self._ended(admitted, refused.status, refused.reason)
            raise
        return admitted

    async def run(self, admitted: AdmittedCall) -> types.CallToolResult:
        """Relays an admitted call to its server; settles, counts and audits it however it ends."""
        call, upstream, tool, exchange = admitted.call, admitted.upstream, admitted.tool, admitted.exchange
        outcome = "ok"
        try:
            # the client's trace context goes on; with tracing on, the gateway's span replaces it as the parent
            meta: dict[str, Any] = {k: v for k, v in call.headers.items() if k in TRACE_FIELDS}
            with exchange.trace.upstream_attempt(exchange.record.channel or "", tool, meta) as span:
                exchange.upstream_started = time.monotonic()
                # the SDK's client writes the current context's traceparent into `_meta` itself, and the SDK's
                # server made the caller's context current: the gateway's span must be the current one meanwhile
                token = otel_context.attach(otel_trace.set_span_in_context(span))
                try:
                    result = await upstream.call(tool, call.arguments, meta)
                finally:
                    otel_context.detach(token)
            outcome = "tool_error" if result.is_error else "ok"
            return result
        except UpstreamFailure as failure:
            outcome = failure.failure.value
            code = failure.code if failure.code is not None else UPSTREAM_FAILED
            raise CallRefused(STATUS[outcome], str(failure), code, outcome,
                              1.0 if failure.failure is Failure.breaker_open else None) from None
        except BaseException:
            outcome = "cancelled"
            raise
        finally:
            await self._ended(admitted, STATUS.get(outcome, 499), outcome)

    async def release(self, admitted: AdmittedCall) -> None:
        """Ends an admitted call that was never run (its request failed on the way), free of charge."""
        await self._ended(admitted, 499, "not_run")

    async def _ended(self, admitted: AdmittedCall, status: int, outcome: str) -> None:
        if admitted.ended:
            return
        admitted.ended = True
        seconds = time.monotonic() - admitted.started
        await admitted.exchange.end(status, "refused" if status == 429 else outcome,
                                    Usage(1) if outcome in CHARGED else None)
        self._metrics.mcp.called(admitted.upstream.name, admitted.tool, outcome, seconds)
        self._audit(admitted.call, admitted.upstream, admitted.tool, outcome, seconds)

    async def _resolve(self, call: ToolCall) -> tuple[McpUpstream, str]:
        parts = split_name(call.name)
        upstream = None if parts is None else self.registry.servers.get(parts[0])
        if parts is None or upstream is None:
            raise CallRefused(404, f"unknown tool {call.name!r}: tools are named server__tool", UNKNOWN_TOOL,
                              "tool_not_found")
        tool = parts[1]
        if not may_use(call.key, upstream.config, tool):
            raise CallRefused(403, f"this key may not use the tool {call.name!r}", TOOL_REFUSED, "tool_not_allowed")
        if tool not in {t.name for t in await upstream.tools()}:
            if not upstream.listed:
                raise CallRefused(503, f"MCP server {upstream.name!r} cannot be reached to list its tools",
                                  UPSTREAM_FAILED, Failure.unavailable.value, 1.0)
            raise CallRefused(404, f"unknown tool {call.name!r}: the server {upstream.name!r} does not list it",
                              UNKNOWN_TOOL, "tool_not_found")
        size, limit = arguments_size(call.arguments), upstream.config.max_argument_bytes
        if size > limit:
            raise CallRefused(413, f"the arguments ({size} bytes) are over this server's limit of {limit} bytes",
                              TOO_LARGE, "arguments_too_large")
        return upstream, tool

    async def _admit(self, exchange: Exchange, key: KeyInfo, upstream: McpUpstream, tool: str) -> None:
        model = model_name(upstream.name, tool)
        # a priced server's calls cost one "input token" at its per-call price (kept as `mcp:server__*`)
        places = (((exchange.record.channel or "", (model, every_tool(upstream.name))),)
                  if upstream.config.price_per_call is not None else ())
        with exchange.trace.admission():
            admission = await self._quota.admit(key, model=model, estimated_tokens=1,
                                                request_id=exchange.record.request_id, places=places)
        exchange.record.degraded = admission.degraded
        if not admission.admitted or admission.reservation is None:
            self._metrics.refused(admission.refused_level, admission.refused_limit)
            raise _refused(refusal(admission, model))
        exchange.hold(admission.reservation)

    @staticmethod
    def _audit(call: ToolCall, upstream: McpUpstream, tool: str, outcome: str, seconds: float) -> None:
        if not audit_log.isEnabledFor(logging.INFO):
            return
        line: dict[str, Any] = {"event": "mcp_call", "request_id": call.request_id, "key_id": call.key.id,
                                "account_id": call.key.account_id, "sub_account_id": call.key.sub_account_id,
                                "server": upstream.name, "tool": tool, "outcome": outcome,
                                "latency_ms": round(seconds * 1000, 2)}
        if call.key.account_id in upstream.config.log_arguments_for:
            line["arguments"] = call.arguments
        audit_log.info(json.dumps(line, separators=(",", ":"), default=str))


def _refused(error: ApiError) -> CallRefused:
    milliseconds = error.headers.get("retry-after-ms")
    return CallRefused(error.status, error.message, RATE_LIMITED if error.status == 429 else TOOL_REFUSED,
                       error.code or "refused", int(milliseconds) / 1000 if milliseconds else None,
                       dict(error.headers))
