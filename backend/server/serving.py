"""The two completion endpoints: body in, engine request out, deltas back as one JSON body or an SSE stream.

A request holds its 200 until the engine produced its first delta, so an overloaded or timed-out queue is
still answered 503 with Retry-After (which lets a gateway fail over); after that, failures become an SSE
`error` event. The client's disconnect is watched at every wait and aborts the engine request at once.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable
from typing import TYPE_CHECKING, Any, TypeVar

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from backend.engine.errors import EngineOverloaded, InvalidGenerateRequest, QueueTimeout
from backend.engine.records import Delta, GenerateRequest
from backend.engine.structured_output import (
    CompilerBusy,
    Constraint,
    ConstraintError,
    GrammarState,
    TenantCompilesBusy,
)
from backend.server.api_errors import ApiError, internal, invalid, model_not_found, unavailable
from backend.server.fields.gateway import check_gateway_fields
from backend.server.logprobs import LogprobsFormatter
from backend.server.protocol import (
    Endpoint,
    ValidatedRequest,
    check_token_ids,
    decode_body,
    parse_request,
    resolve_max_tokens,
)
from backend.server.request_log import CLIENT_GONE, RequestLogLine
from backend.server.responses import ResponseBuilder, usage
from backend.server.tool_stream import tool_stream
from backend.server.tools import parse_calls, render_chat
from common.event_stream import (
    DONE_EVENT,
    EventStreamResponse,
    error_event,
    json_event,
    wait_for_disconnect,
)
from common.openai_errors import retry_after_headers
from common.request_body import read_body
from common.request_id import request_id
from config.secret_files import read_secret

if TYPE_CHECKING:
    from backend.engine.core import Engine
    from backend.server.metrics import BackendMetrics
    from backend.server.tracing import BackendTracing
    from config.backend import BackendSettings

log = logging.getLogger("tidegate.backend.server")
T = TypeVar("T")
LOADING_RETRY_AFTER = 5.0
COMPILER_RETRY_AFTER = 2.0
OFF_LOOP_CHARS = 8192
ROUTES = {Endpoint.CHAT.value: "/v1/chat/completions", Endpoint.COMPLETION.value: "/v1/completions"}


class ClientGone(Exception):
    """The client disconnected before its response could be sent."""


class EngineAborted(Exception):
    """The engine ended a request the client still waits for (a failed step, or shutdown)."""


class OpenAIServing:
    """Serves /v1/completions and /v1/chat/completions over one engine."""

    def __init__(self, served_model: str, metrics: BackendMetrics, settings: BackendSettings,
                 tracing: BackendTracing | None = None) -> None:
        self.served_model = served_model
        self.metrics = metrics
        self.tracing = tracing
        self.settings = settings
        token_file = settings.gateway_token_file
        self.gateway_token = None if token_file is None else read_secret(token_file, "gateway token")
        self.engine: Engine | None = None  # set once the model is loaded and warmed up
        self.generation_defaults: dict[str, Any] = {}  # what a request's omitted sampling fields become

    async def handle(self, request: Request, endpoint: Endpoint) -> Response:
        record = RequestLogLine(request_id(request.headers), endpoint.value,
                               traceparent=request.headers.get("traceparent"))
        try:
            response = await self._serve(request, endpoint, record)
        except ApiError as err:
            record.failed(err.status, err.message)
            response = err.response()
        except ClientGone:
            record.failed(CLIENT_GONE, "client disconnected")
            self._finished(record, None)
            response = Response(status_code=CLIENT_GONE)
        except Exception as exc:
            response = self._internal_error(record, exc).response()
        response.headers["x-request-id"] = record.request_id
        if not isinstance(response, EventStreamResponse):
            record.write()  # a stream writes its record when it ends
        return response

    async def _serve(self, request: Request, endpoint: Endpoint, record: RequestLogLine) -> Response:
        settings = self.settings
        # the backend's clients have known a 413 as `request_too_large` since before the body read was shared
        raw = await read_body(request, max_bytes=settings.max_body_bytes, timeout=settings.body_timeout,
                              too_large_code="request_too_large")
        req = parse_request(decode_body(raw, settings.max_json_depth), endpoint)
        check_gateway_fields(req, request.headers, self.gateway_token)
        record.stream = req.stream
        if req.model != self.served_model:
            raise model_not_found(req.model)
        engine = self.engine
        if engine is None:
            raise unavailable("the model is still loading", LOADING_RETRY_AFTER, "model_loading")
        if prompt_chars(req) > OFF_LOOP_CHARS:  # a long prompt would stall every other stream while it encodes
            prompt_ids = await asyncio.to_thread(self._prompt_ids, engine, req)
        else:
            prompt_ids = self._prompt_ids(engine, req)
        params = req.sampling_params(resolve_max_tokens(req, len(prompt_ids), engine.max_model_len),
                                     self.generation_defaults)
        check_token_ids(params.stop_token_ids, engine.tokenizer.vocab_size, "stop_token_ids")
        check_token_ids(list(params.logit_bias), engine.tokenizer.vocab_size, "logit_bias")
        builder = ResponseBuilder(endpoint, uuid.uuid4().hex, self.served_model, req.include_usage)
        if params.logprobs is not None:
            tokenizer = engine.tokenizer
            builder.logprobs = LogprobsFormatter(endpoint is Endpoint.CHAT,
                                                 lambda t: tokenizer.decode([t], skip_special_tokens=False))
        record.response_id = builder.id
        gen = GenerateRequest(request_id=builder.request_hex, prompt_token_ids=prompt_ids, params=params,
                              priority=req.priority, cache_salt=req.cache_salt, n=req.n,
                              constraint=await grammar_state(engine, req.output_constraint,
                                                             req.cache_salt or ""))
        record.prompt_tokens = len(prompt_ids)
        deltas = engine.generate(gen)
        try:
            first = await self._until_disconnect(request, anext(deltas), gen.request_id)
        except (EngineOverloaded, QueueTimeout, InvalidGenerateRequest) as exc:
            raise self._engine_refusal(exc) from None
        if req.stream:
            return EventStreamResponse(self._events(first, deltas, builder, record, req))
        collected = await self._until_disconnect(request, self._collect(first, deltas, record, req.n),
                                                 gen.request_id)
        finals = [d for d in collected if d.finish_reason is not None]
        last = summary(finals)
        self._finished(record, last)
        if any(d.finish_reason == "abort" for d in finals):  # the client is still here: a failed step
            raise EngineAborted
        choices = []
        for final in sorted(finals, key=lambda d: d.index):
            mine = [d for d in collected if d.index == final.index]
            assert final.finish_reason is not None
            text = "".join(d.text for d in mine)
            content, calls = parse_calls(text, req.tools) if req.tools is not None else (text, [])
            body = builder.response(content, final.finish_reason, usage_of(last),
                                    [lp for d in mine for lp in d.logprobs], final.index, calls)
            choices += body["choices"]
        body["choices"] = choices
        return JSONResponse(body)

    def _prompt_ids(self, engine: Engine, req: ValidatedRequest) -> list[int]:
        tok = engine.tokenizer
        if req.messages is not None:
            try:
                text = render_chat(tok, req.messages, req.tools)
            except Exception as exc:  # a template may reject an order of roles it does not support
                raise invalid(f"the chat template rejected `messages`: {exc}", "messages") from None
            return tok.encode_chat(text)  # the template placed the special tokens; BOS only if it did not
        if isinstance(req.prompt, list):
            check_token_ids(req.prompt, tok.vocab_size, "prompt")
            return list(req.prompt)
        assert req.prompt is not None
        return tok.encode(req.prompt, add_special_tokens=True)

    async def _until_disconnect(self, request: Request, work: Awaitable[T], engine_request_id: str) -> T:
        """Await `work`, or abort the engine request and raise ClientGone if the client leaves first."""
        task = asyncio.ensure_future(work)
        watch = asyncio.ensure_future(wait_for_disconnect(request.receive))
        try:
            done, _ = await asyncio.wait({task, watch}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            watch.cancel()
            if not task.done():
                task.cancel()
        if task not in done:
            self._abort(engine_request_id)
            raise ClientGone
        return task.result()

    async def _collect(self, first: Delta, deltas: AsyncIterator[Delta], record: RequestLogLine,
                       n: int) -> list[Delta]:
        """Every delta of the request's n choices, until each has ended."""
        collected: list[Delta] = []
        delta = first
        while True:
            if delta.token_ids:
                record.token_seen()
            collected.append(delta)
            n -= delta.finish_reason is not None
            if n == 0:
                return collected
            delta = await anext(deltas)

    async def _events(self, first: Delta, deltas: AsyncIterator[Delta], builder: ResponseBuilder,
                      record: RequestLogLine, req: ValidatedRequest) -> AsyncGenerator[bytes, None]:
        """The SSE body; its `finally` runs on every exit, including the client's disconnect."""
        last: Delta | None = None
        finals: list[Delta] = []
        n = req.n
        # a choice's text that may be a tool call becomes call deltas (backend/server/tool_stream.py)
        tool_streams = {i: tool_stream(req.tools) for i in range(n)} if req.tools is not None else {}
        try:
            for index in range(n):
                if (role := builder.role_chunk(index)) is not None:
                    yield json_event(role)
            delta = first
            while True:
                if delta.token_ids:
                    record.token_seen()
                calls_of = tool_streams.get(delta.index)
                text, calls = calls_of.push(delta.text) if calls_of is not None else (delta.text, [])
                if text or delta.logprobs:
                    yield json_event(builder.text_chunk(text, logprobs=delta.logprobs, index=delta.index))
                for call in calls:
                    yield json_event(builder.tool_call_chunk(call, delta.index))
                if delta.finish_reason == "abort":
                    raise EngineAborted
                if delta.finish_reason is not None:
                    finish_reason = delta.finish_reason
                    if calls_of is not None:  # the held tail: content, or the calls it holds
                        held, calls, called = calls_of.finish()
                        if held:
                            yield json_event(builder.text_chunk(held, index=delta.index))
                        for call in calls:
                            yield json_event(builder.tool_call_chunk(call, delta.index))
                        finish_reason = "tool_calls" if called and finish_reason == "stop" else finish_reason
                    yield json_event(builder.text_chunk("", finish_reason, index=delta.index))
                    finals.append(delta)
                    if len(finals) == n:
                        last = summary(finals)
                        break
                try:
                    delta = await anext(deltas)
                except (EngineOverloaded, QueueTimeout, InvalidGenerateRequest) as exc:
                    err = self._engine_refusal(exc)
                    record.failed(err.status, err.message)
                    yield error_event(err)
                    return
            if builder.include_usage:
                yield json_event(builder.usage_chunk(usage_of(last)))
            yield DONE_EVENT
        except Exception as exc:
            yield error_event(self._internal_error(record, exc))
        finally:
            if last is None:
                self._abort(builder.request_hex)
                if record.error is None:
                    record.failed(CLIENT_GONE, "client disconnected")
            self._finished(record, last)

    def _finished(self, record: RequestLogLine, last: Delta | None) -> None:
        if last is not None:
            record.completion_tokens = last.completion_tokens
            record.cached_tokens = last.cached_tokens
            record.finish_reason = last.finish_reason
            timings = last.timings
            if timings is not None and timings.scheduled is not None:
                record.queue_time = timings.scheduled - timings.queued
            self.metrics.request_finished(last.prompt_tokens, last.completion_tokens, last.finish_reason or "stop",
                                          timings)
            if self.tracing is not None and timings is not None:
                headers = {"traceparent": record.traceparent} if record.traceparent else {}
                self.tracing.record(headers, route=ROUTES[record.endpoint], request_id=record.request_id,
                                    model=self.served_model, timings=timings, prompt_tokens=last.prompt_tokens,
                                    completion_tokens=last.completion_tokens, cached_tokens=last.cached_tokens,
                                    finish_reason=last.finish_reason, status_code=record.status)
        elif record.status == CLIENT_GONE:
            record.finish_reason = "abort"
            self.metrics.request_finished(record.prompt_tokens, 0, "abort", None)
        record.write()

    def _internal_error(self, record: RequestLogLine, exc: Exception) -> ApiError:
        """Log a failure that is ours, not the client's, with its request id; the client sees a plain 500."""
        log.error("internal error in request %s: %r", record.request_id, exc,
                  exc_info=not isinstance(exc, EngineAborted))
        err = internal(record.request_id)
        record.failed(err.status, err.message)
        return err

    def _engine_refusal(self, exc: Exception) -> ApiError:
        if isinstance(exc, InvalidGenerateRequest):
            return invalid(str(exc))
        reason = "queue_timeout" if isinstance(exc, QueueTimeout) else "overloaded"
        self.metrics.request_rejected(reason)
        retry_after = float(getattr(exc, "retry_after", 1.0))
        return unavailable(f"the server is overloaded: {exc}", retry_after, reason)

    def _abort(self, request_id: str) -> None:
        if self.engine is not None:
            self.engine.abort(request_id)


async def grammar_state(engine: Engine, constraint: Constraint | None, tenant: str) -> GrammarState | None:
    """A fresh matcher for the request's constraint, compiled (or found in the tenant's cache) off the event
    loop; `tenant` is the gateway's cache salt, "" for every caller without one."""
    if constraint is None:
        return None
    try:
        return await asyncio.to_thread(engine.grammars.state_for, constraint, tenant)
    except ConstraintError as exc:
        raise invalid(str(exc), exc.field) from None
    except TenantCompilesBusy as exc:
        raise ApiError(429, f"too many output constraints compiling: {exc}; retry when they are done",
                       "rate_limit_exceeded", "too_many_compiles", None,
                       retry_after_headers(COMPILER_RETRY_AFTER)) from None
    except CompilerBusy as exc:
        raise unavailable(f"the server is overloaded: {exc}", COMPILER_RETRY_AFTER, "overloaded") from None


def prompt_chars(req: ValidatedRequest) -> int:
    if req.messages is not None:
        return sum(len(m["content"]) for m in req.messages)
    return len(req.prompt) if isinstance(req.prompt, str) else 0


def summary(finals: list[Delta]) -> Delta:
    """One final delta for the whole request: its first choice's, with every choice's completion tokens
    (the prompt was computed, and is counted, once)."""
    first = min(finals, key=lambda d: d.index)
    return dataclasses.replace(first, completion_tokens=sum(d.completion_tokens for d in finals))


def usage_of(delta: Delta) -> dict[str, Any]:
    return usage(delta.prompt_tokens, delta.completion_tokens, delta.cached_tokens)

