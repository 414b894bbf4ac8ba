"""The request path, top to bottom: auth, body, admission, priority queue, route and call, relay, settle."""

from __future__ import annotations

import asyncio
import time

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from common.event_stream import EventStreamResponse, StreamEnd
from common.fast_json import FastJSONResponse
from common.request_body import read_body
from common.request_id import request_id as request_id_of
from config import GatewaySettings
from gateway.auth import authenticate
from gateway.channels.limits import CapacityAsk
from gateway.channels.router import Router
from gateway.errors import ApiError, forbidden, not_found
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.tracing import Tracing
from gateway.path.admission import bound_output, estimate_prompt_tokens, rate_headers, refusal
from gateway.path.assembly import Assembly
from gateway.path.client_wire import ClientWire
from gateway.path.departure import ClientLeft, Departure
from gateway.path.exchange import Exchange
from gateway.path.priority import PriorityPools
from gateway.path.relay import StreamRelay, outcome_error
from gateway.path.request_extras import cache_scope_salt, request_extras, salt_secret
from gateway.path.upstream import Answer, UpstreamClient, UpstreamRequest
from gateway.path.upstream_answers import client_answer, is_reported
from gateway.records import Endpoint, OpenAIRequest, Outcome, Usage
from quota import KeyInfo, QuotaService

# which public model answered: the one asked for, or a fallback of its group; absent when no upstream answered
SERVED_MODEL = "x-tidegate-served-model"


class Proxy:
    """Serves every inbound API through one path; every request ends through its `Exchange`, exactly once."""

    def __init__(self, settings: GatewaySettings, quota: QuotaService, router: Router,
                 upstream: UpstreamClient, pools: PriorityPools, metrics: GatewayMetrics, tracing: Tracing):
        self.settings = settings
        self.quota = quota
        self.router = router
        self.upstream = upstream
        self.pools = pools
        self.metrics = metrics
        self.tracing = tracing
        self._renew_interval = max(0.5, settings.lease_ttl / 3)
        self._salt_secret = salt_secret(settings)

    async def serve(self, request: Request, wire: ClientWire, key: KeyInfo | None = None) -> Response:
        """One request of any inbound API, served as chat, completions or embeddings and answered in the API's
        shape by its `wire`; `key` is given for work the gateway runs for a key it already knows (a batch line)."""
        request_id = request_id_of(request.headers)
        path = request.scope["path"]  # an inference route's own path: `request.url` would rebuild the whole URL
        trace = self.tracing.start_request("POST", path, request_id, request.headers)
        exchange = Exchange(self.quota, self.metrics, request_id, path, self._renew_interval, trace)
        ask: UpstreamRequest | None = None
        departure = Departure(request.receive)
        try:
            if key is None:
                key = await authenticate(self.quota, request)
            exchange.identify(key)
            limits = self.settings.server
            raw = await read_body(request, max_bytes=self.settings.max_body_bytes, timeout=limits.body_timeout)
            departure.start()  # the body was read in full: what the client sends now can only be its leaving
            call = await wire.parse(raw, key, classes=set(self.pools.pools), max_depth=limits.max_json_depth)
            exchange.record.model, exchange.record.stream = call.model, call.stream
            trace.set_model(call.model)
            self._check_model(key, call)
            headers = await self._admit(exchange, key, call, request_id)
            pool = self.pools.choose(key.priority_class, call.priority_class, key.class_ceiling)
            # a client that leaves while queued or waiting for the first token frees its slot and the upstream now
            await departure.until_left(exchange.take_slot(pool))
            deadline = exchange.started + self.settings.timeouts.total
            exchange.upstream_started = time.monotonic()
            salt = cache_scope_salt(key, self._salt_secret) or ""
            exchange.prefix = self.router.prefix(call.model, call.body, salt) if call.endpoint.generates else None
            ask = UpstreamRequest(call.model, call.endpoint.value, call.body, call.stream, deadline, request_id, trace,
                                  request_extras(key, pool, self._salt_secret),
                                  CapacityAsk(call.model, exchange.estimated_tokens, request_id,
                                              pool.settings.queue_timeout),
                                  allowed=key.allows, barred=self._barred(call), streamable=call.endpoint.generates,
                                  prefix=exchange.prefix)
            answer = await departure.until_left(self.upstream.call(ask))
            exchange.hold_capacity(answer.capacity, self.upstream.release_capacity)
        except ClientLeft:
            departure.stop()
            await exchange.end(499, Outcome.disconnected.value, _accepted(exchange, ask))
            return Response(status_code=499)  # nobody is there to read it
        except ApiError as error:
            departure.stop()
            await exchange.end(error.status, "refused" if error.status < 500 else "failed", _accepted(exchange, ask))
            return _error_response(wire, error, headers={"x-request-id": request_id})
        except asyncio.CancelledError:
            departure.stop()
            await exchange.end(499, "cancelled", _accepted(exchange, ask))
            raise
        except Exception:
            departure.stop()
            await exchange.end(500, "error")
            raise
        exchange.record.channel, exchange.record.attempts = answer.channel.name, answer.attempts
        headers[SERVED_MODEL] = exchange.record.served_model = answer.model
        exchange.first_token()
        if answer.events is not None and not call.stream:
            try:
                return await self._assembled(departure, wire, exchange, answer, call.endpoint is Endpoint.chat,
                                             headers, deadline)
            finally:
                departure.stop()
        departure.stop()  # a stream's response watches for itself from here
        if answer.events is not None:
            return self._stream(wire, exchange, answer, call, headers, deadline)
        return await self._whole(wire, exchange, answer, call, headers)

    def _check_model(self, key: KeyInfo, call: OpenAIRequest) -> None:
        model = call.model
        if not key.allows(model):
            raise forbidden(f"this key may not use model {model!r}", "model_not_allowed")
        if not self.router.serves(model):
            raise not_found(f"the model {model!r} does not exist", "model_not_found")
        if call.endpoint is Endpoint.embeddings and not any(c.config.embeddings for c, _ in self.router.targets(model)):
            raise not_found(f"no channel serves embeddings for the model {model!r}", "model_not_found")

    def _barred(self, call: OpenAIRequest) -> frozenset[str]:
        """Channels that never get this request: for embeddings, those that do not declare them."""
        if call.endpoint is not Endpoint.embeddings:
            return frozenset()
        return frozenset(c.name for c in self.router.channels if not c.config.embeddings)

    async def _admit(self, exchange: Exchange, key: KeyInfo, call: OpenAIRequest,
                     request_id: str) -> dict[str, str]:
        prompt = estimate_prompt_tokens(call.body, image_tokens=self.settings.image_prompt_tokens)
        generates, chat = call.endpoint.generates, call.endpoint is Endpoint.chat
        max_output = bound_output(call.body, chat, self.settings.default_max_tokens) if generates else 0
        with exchange.trace.admission() as span:
            admission = await self.quota.admit(key, model=call.model, estimated_tokens=prompt + max_output,
                                               request_id=request_id, max_output_tokens=max_output,
                                               places=self.router.price_places(call.model))
            if not admission.admitted:
                span.set_attribute("tidegate.refused_level", str(admission.refused_level))
                span.set_attribute("tidegate.refused_limit", str(admission.refused_limit))
        exchange.record.degraded = admission.degraded
        exchange.record.prompt_tokens = prompt
        if not admission.admitted or admission.reservation is None:
            self.metrics.refused(admission.refused_level, admission.refused_limit)
            raise refusal(admission, call.model)
        exchange.hold(admission.reservation)
        headers = {"x-request-id": request_id, **rate_headers(admission.rate)}
        if admission.degraded:
            headers["x-tidegate-degraded"] = "1"
        return headers

    async def _whole(self, wire: ClientWire, exchange: Exchange, answer: Answer, call: OpenAIRequest,
                     headers: dict[str, str]) -> Response:
        # a 4xx from the upstream is the request's fault, not the channel's; a broken answer (5xx for the client) is
        verdict = answer.status < 500
        try:
            reply = client_answer(answer, exchange.record.prompt_tokens, call.endpoint.generates)
            verdict = reply.status < 500
        finally:
            await answer.finish(verdict)
        status, body = await wire.whole(reply.status, reply.body)
        await exchange.end(status, "ok" if status < 300 else "upstream_error", reply.usage)
        return Response(body, status, headers, media_type="application/json")

    async def _assembled(self, departure: Departure, wire: ClientWire, exchange: Exchange, answer: Answer,
                         chat: bool, headers: dict[str, str], deadline: float) -> Response:
        """A non-streamed request answered from an upstream stream: one JSON body once the stream is done."""
        relay = StreamRelay(answer, wants_usage=True, deadline=deadline, idle=answer.channel.timeouts.idle)
        assembly = Assembly(chat, answer.model)
        stayed = False
        try:
            # a client that leaves is noticed at once: closing the upstream call stops the generation there
            await departure.until_left(self._fold(relay, assembly))
            stayed = True
        except ClientLeft:
            pass
        finally:
            if not stayed:
                await relay.close(StreamEnd.disconnected)
                await exchange.end(499, relay.outcome.value, self._charged(exchange, relay))
        if not stayed:
            return Response(status_code=499)  # nobody is there to read it
        await relay.close(StreamEnd.finished)
        # a cut answer is never passed on truncated: the client gets an error, and is charged what was generated
        error = None if relay.outcome is Outcome.ok else outcome_error(relay.outcome)
        if error is None:
            try:
                whole = await wire.answer(assembly.answer())
            except ApiError as untranslatable:
                error = untranslatable
            else:
                await exchange.end(200, relay.outcome.value, self._charged(exchange, relay))
                return FastJSONResponse(whole, headers=headers)
        await exchange.end(error.status, relay.outcome.value, self._charged(exchange, relay))
        return _error_response(wire, error, headers)

    @staticmethod
    async def _fold(relay: StreamRelay, assembly: Assembly) -> None:
        async for chunk in relay.json_chunks():
            assembly.add(chunk)

    @staticmethod
    def _charged(exchange: Exchange, relay: StreamRelay) -> Usage:
        # without the upstream's usage (cut, the client left, an upstream that does not count), charge the prompt
        # estimate and what was generated
        if relay.usage is not None and is_reported(relay.usage):
            return relay.usage
        return Usage(exchange.record.prompt_tokens, relay.chunks)

    def _stream(self, wire: ClientWire, exchange: Exchange, answer: Answer, call: OpenAIRequest,
                headers: dict[str, str], deadline: float) -> Response:
        relay = StreamRelay(answer, wants_usage=call.wants_usage, deadline=deadline,
                            idle=answer.channel.timeouts.idle)

        async def end(how: StreamEnd = StreamEnd.finished) -> None:
            await relay.close(how)
            await exchange.end(200, relay.outcome.value, self._charged(exchange, relay))

        # the total deadline covers writing to the client too: one that stops reading is cut there
        events = wire.events(relay, end, call.model, exchange.record.prompt_tokens)
        return EventStreamResponse(events, headers, deadline=deadline, on_close=end)


def _accepted(exchange: Exchange, ask: UpstreamRequest | None) -> Usage | None:
    """What a request that ended before its answer costs: its prompt, once an upstream accepted it (the prefill
    ran there), else nothing."""
    return Usage(exchange.record.prompt_tokens) if ask is not None and ask.accepted else None


def _error_response(wire: ClientWire, error: ApiError, headers: dict[str, str]) -> Response:
    return JSONResponse(wire.error_body(error), error.status, {**headers, **error.headers})
