"""The upstream client: one call to a model, over as many attempts and channels as the deadline allows.

Layered deadlines per attempt: connect, first token (the first content token, not the headers) and
the total deadline of the request; the idle deadline between chunks is the relay's. A non-streamed request is
streamed upstream too (unless its channel cannot stream), so the first token means the same for both.

Retries cover connect errors, broken answers, 429 and 5xx before the first byte, prefer a channel not yet tried,
back off exponentially with full jitter and honour `Retry-After` when it fits in what is left. A first-token
timeout is a slow generation, not a fault: it moves to another channel or ends, never tries the same one again.
Once the upstream answered 2xx, that timeout is the request's own (a forced tool call, a long schema-bound string):
it says nothing against the channel, so no tenant can open a breaker for everyone, and the request is marked
`accepted` so that its prompt is charged.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from common import fast_json
from common.http_client import AnswerBroken, ConnectFailed, ConnectTimeout, HttpAnswer, HttpClient
from config import Retries
from gateway.channels.affinity import RoutedPrefix
from gateway.channels.kinds import kind_of
from gateway.channels.limits import CapacityAsk, CapacityHold, ChannelLimits
from gateway.channels.router import Pick, Router, any_model
from gateway.channels.state import ChannelState
from gateway.errors import ApiError, gateway_timeout, retry_after_headers, unavailable
from gateway.observe.tracing import NOOP_REQUEST, RequestTrace
from gateway.sse import DONE, has_content, split_events


class FailureKind(StrEnum):
    """How an attempt failed, classified by transport outcome and status, never by message text."""

    connect = "connect"
    timeout = "timeout"  # the connect deadline, or nothing left of the request's deadline
    first_token = "first_token"  # connected, but no answer in time: the upstream may be stuck
    held = "held"  # answered 2xx, but no first token in time: the request's generation, not the channel's fault
    rate_limited = "rate_limited"
    server_error = "server_error"
    broken = "broken"  # the connection broke or the answer was not HTTP/SSE we can read


USER_AGENT = "tidegate-gateway"
# first-token timeouts: the same channel is never tried again for the request
SLOW = (FailureKind.first_token, FailureKind.held)


@dataclass(slots=True)
class AttemptFailed(Exception):
    kind: FailureKind
    detail: str
    retry_after: float | None = None


@dataclass(slots=True)
class UpstreamRequest:
    """What the app asks for: a public model name and an OpenAI body, with an absolute deadline."""

    model: str
    path: str
    body: dict[str, Any]
    stream: bool
    deadline: float  # time.monotonic() by which the whole request must end
    request_id: str = ""
    trace: RequestTrace = NOOP_REQUEST
    extras: dict[str, Any] = field(default_factory=dict)  # set by the gateway; sent where a channel accepts them
    capacity: CapacityAsk | None = None  # what to take from the channel's and model's shared limits
    allowed: Callable[[str], bool] = any_model  # which fallback models the key may be served
    prefix: RoutedPrefix | None = None  # the prompt's prefix chain, where the model routes by prefix affinity
    barred: frozenset[str] = frozenset()  # channels that cannot serve this request's endpoint
    streamable: bool = True  # false: never asked for a stream (embeddings)
    accepted: bool = False  # an upstream answered 2xx to an attempt: work was done, the prompt is charged


@dataclass(slots=True)
class Answer:
    """An upstream's answer that reached its first byte; it holds its channel's in-flight slot until `finish`."""

    channel: ChannelState
    model: str  # the public model that served: the one asked for, or a fallback
    upstream_model: str
    status: int
    response: HttpAnswer
    attempts: int
    body: bytes = b""  # the whole body, when not streamed upstream or not 2xx
    first_events: list[bytes] = field(default_factory=list)  # events up to and including the first token
    read_ahead: list[bytes] = field(default_factory=list)  # what came after the first token in its read
    events: AsyncIterator[list[bytes]] | None = None  # the rest of the stream, read by read; None for a whole body
    capacity: CapacityHold | None = None  # taken from shared limits; given back when the request ends
    _finished: bool = False

    async def finish(self, ok: bool | None) -> None:
        """Release the channel slot and tell the breaker: True success, False failure, None no verdict."""
        if self._finished:
            return
        self._finished = True
        self.channel.in_flight -= 1
        _judge(self.channel, self.model, ok)
        _close(self.response, reuse=ok is True)


def _judge(channel: ChannelState, model: str, ok: bool | None) -> None:
    breaker = channel.breaker(model)
    if ok is None:
        breaker.abandon()
        return
    breaker.record(ok)
    if not ok:
        channel.counters(model).failures += 1


class UpstreamClient:
    """Sends one request to the channels serving its model, retrying within the request's deadline."""

    def __init__(self, router: Router, retries: Retries, client: HttpClient,
                 rng: random.Random | None = None, limits: ChannelLimits | None = None):
        self._router = router
        self._limits = limits
        self._retries = retries
        self._client = client
        self._rng = rng or random.Random()

    async def call(self, request: UpstreamRequest) -> Answer:
        tried: set[str] = set()
        # channels that cannot serve the endpoint, and those that let a first token time out: a retry would pile on
        barred: set[str] = set(request.barred)
        last: AttemptFailed | None = None
        for attempt in range(self._retries.max_attempts):
            pick, hold = await self._pick(request, tried, barred)
            if pick is None:
                break
            headers: dict[str, str] = {}
            with request.trace.upstream_attempt(pick.channel.name, pick.upstream_model, headers) as span:
                try:
                    answer = await self._attempt(pick, request, attempt + 1, headers)
                    span.set_attribute("http.response.status_code", answer.status)
                    answer.capacity = hold
                    return answer
                except BaseException as failure:
                    if hold is not None:  # nothing was generated: every reserved token goes back
                        await asyncio.shield(self.release_capacity(hold, 0))
                    if not isinstance(failure, AttemptFailed):
                        raise
                    span.set_attribute("error.type", failure.kind.value)
                    last = failure
                    tried.add(pick.channel.name)
                    if failure.kind in SLOW:
                        barred.add(pick.channel.name)
            if attempt + 1 == self._retries.max_attempts:
                break
            if last.kind in SLOW and not self._router.has_other(request.model, barred,
                                                                                 request.allowed):
                break  # every channel let this request's first token time out: no backoff to wait out
            other = self._router.has_other(request.model, tried | request.barred, request.allowed)
            wait = self._backoff(attempt, last, other)
            if wait is None or time.monotonic() + wait >= request.deadline:
                break
            await asyncio.sleep(wait)
        raise _final_error(request.model, last)

    async def _pick(self, request: UpstreamRequest, tried: set[str],
                    barred: set[str]) -> tuple[Pick | None, CapacityHold | None]:
        if self._limits is None or request.capacity is None:
            return self._router.route(request.model, tried, barred, request.allowed, request.prefix), None
        return await self._limits.pick(self._router, request.capacity, tried, barred, request.allowed,
                                       request.prefix)

    async def release_capacity(self, hold: CapacityHold, used_tokens: int) -> None:
        if self._limits is not None:
            await self._limits.release(hold, used_tokens)

    def _backoff(self, attempt: int, failure: AttemptFailed, other_channel: bool) -> float | None:
        """Full jitter; the upstream's Retry-After only binds a retry of the same channel."""
        jitter = self._rng.uniform(0, min(self._retries.backoff_max, self._retries.backoff_base * 2**attempt))
        if failure.retry_after is not None and not other_channel:
            return max(failure.retry_after, jitter)
        return jitter

    async def _attempt(self, pick: Pick, request: UpstreamRequest, attempt: int,
                       headers: dict[str, str]) -> Answer:
        channel, model, upstream_model = pick.channel, pick.model, pick.upstream_model
        timeouts = channel.timeouts
        # the request's deadline bounds every attempt; a channel's own `total` may bound it tighter
        remaining = min(request.deadline - time.monotonic(), timeouts.total)
        if remaining <= 0:
            _judge(channel, model, None)
            raise AttemptFailed(FailureKind.timeout, "the request's deadline passed")
        channel.in_flight += 1
        channel.counters(model).attempts += 1
        response: HttpAnswer | None = None
        failure: AttemptFailed
        try:
            async with asyncio.timeout(min(timeouts.first_token, remaining)):
                response = await self._send(channel, request, upstream_model, headers)
                request.accepted = request.accepted or response.status < 300
                answer = Answer(channel, model, upstream_model, response.status, response, attempt)
                await self._read_head(answer, request.stream, streams_upstream(channel, request))
                return answer
        except AttemptFailed as refused:
            await _give_up(channel, model, response, refused)
            raise
        except TimeoutError as exc:
            # the connect deadline is a deadline (504, as nginx and Envoy answer), not a refusal (502)
            if isinstance(exc, ConnectTimeout):
                failure = AttemptFailed(FailureKind.timeout, type(exc).__name__)
            elif response is not None and response.status < 300:
                failure = AttemptFailed(FailureKind.held, "no first token in time")
            else:
                failure = AttemptFailed(FailureKind.first_token, "no first token in time")
        except ConnectFailed as exc:
            failure = AttemptFailed(FailureKind.connect, f"cannot connect: {type(exc.__cause__ or exc).__name__}")
        except (AnswerBroken, ValueError) as exc:
            failure = AttemptFailed(FailureKind.broken, type(exc).__name__)
        except BaseException:
            # cancelled (client left): no verdict on the channel, but free its slot
            await _give_up(channel, model, response, None)
            raise
        await _give_up(channel, model, response, failure)
        raise failure

    async def _send(self, channel: ChannelState, request: UpstreamRequest, upstream_model: str,
                    headers: dict[str, str]) -> HttpAnswer:
        body = dict(request.body)
        body["model"] = upstream_model
        body.update({name: value for name, value in request.extras.items() if name in channel.config.extras})
        if streams_upstream(channel, request):
            # usage is needed to settle; the relay strips it again if the client did not ask for it
            body["stream"] = True
            body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        wire = kind_of(channel.config).call(channel.config, request.path, body)
        headers.update(wire.headers)
        headers["content-type"] = "application/json"
        headers.setdefault("user-agent", USER_AGENT)  # some APIs' front doors refuse a request without one
        # a compressed answer would have to be decoded before its usage can be read; ask for it plain
        headers["accept-encoding"] = "identity"
        if request.request_id:
            headers["x-request-id"] = request.request_id
        # the first-token and idle deadlines are enforced around reads; the client only bounds the connect
        return await self._client.post(wire.url, fast_json.dumps(wire.body), headers, connect=channel.timeouts.connect)

    async def _read_head(self, answer: Answer, client_stream: bool, stream: bool) -> None:
        status = answer.status
        if status == 429 or status >= 500:
            await answer.response.read()
            retry_after = _retry_after(answer.response)
            # a 503 with Retry-After is load shedding (busy, not broken), like a 429
            busy = status == 429 or (status == 503 and retry_after is not None)
            kind = FailureKind.rate_limited if busy else FailureKind.server_error
            raise AttemptFailed(kind, f"upstream answered {status}", retry_after)
        # an upstream that answers a whole body although asked for a stream is served as it answered
        whole = not client_stream and answer.response.content_type != "text/event-stream"
        wire = kind_of(answer.channel.config)
        if not stream or status >= 300 or whole:
            answer.body = wire.whole(status, await answer.response.read())
            return
        answer.events = wire.events(split_events(answer.response.chunks()))
        async for batch in answer.events:
            for at, data in enumerate(batch):
                if data == DONE or has_content(fast_json.loads(data)):
                    answer.first_events += batch[:at + 1]
                    answer.read_ahead = batch[at + 1:]
                    return
            answer.first_events += batch
        raise AttemptFailed(FailureKind.broken, "the stream ended before its first token")


def streams_upstream(channel: ChannelState, request: UpstreamRequest) -> bool:
    """Whether an attempt asks for a stream: always for a streamed client, else when the channel can stream."""
    return request.stream or (request.streamable and channel.config.stream_upstream)


async def _give_up(channel: ChannelState, model: str, response: HttpAnswer | None,
                   failure: AttemptFailed | None) -> None:
    channel.in_flight -= 1
    # a 429 says the channel is busy, not broken, and a held first token is the request's: neither counts
    neutral = failure is None or failure.kind in (FailureKind.rate_limited, FailureKind.held)
    _judge(channel, model, None if neutral else False)
    if response is not None:
        _close(response, reuse=False)


def _close(response: HttpAnswer, reuse: bool) -> None:
    """Give the connection back to the pool only after a complete answer; anything else may be mid-body."""
    if reuse:
        response.release()
    else:
        response.close()


def _retry_after(response: HttpAnswer) -> float | None:
    value = response.headers.get("retry-after-ms")
    try:
        if value is not None:
            return float(value) / 1000
        value = response.headers.get("retry-after")
        return float(value) if value is not None else None
    except ValueError:
        return None


def _final_error(model: str, failure: AttemptFailed | None) -> ApiError:
    if failure is None:
        return unavailable(f"no healthy channel serves model {model!r} now", retry_after=1.0,
                           code="no_healthy_channel")
    if failure.kind in (FailureKind.timeout, *SLOW):
        return gateway_timeout(f"the upstream for {model!r} did not answer in time: {failure.detail}")
    if failure.kind is FailureKind.rate_limited:
        return ApiError(503, f"every channel for {model!r} is saturated", "service_unavailable",
                        "upstream_overloaded", None, retry_after_headers(failure.retry_after or 1.0))
    return ApiError(502, f"the upstream for {model!r} failed: {failure.detail}", "upstream_error",
                    "upstream_error")
