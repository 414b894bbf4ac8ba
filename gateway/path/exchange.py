"""One client request's lifetime at the gateway: what it holds, and the single place that lets it go.

Whatever way a request ends (success, upstream error, timeout, client disconnect), `end` runs once:
it stops renewing the concurrency lease, frees the priority slot, settles the reservation with the
real usage and writes the request's one structured log line.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, fields

from gateway.channels.affinity import RoutedPrefix
from gateway.channels.limits import CapacityHold
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.tracing import NOOP_REQUEST, RequestTrace
from gateway.path.priority import PriorityPool
from gateway.records import Usage
from quota import KeyInfo, QuotaService, Reservation

access_log = logging.getLogger("tidegate.gateway.access")
log = logging.getLogger("tidegate.gateway")


@dataclass(slots=True)
class RequestRecord:
    """The fields of the access log line; the key's id, never its secret."""

    request_id: str
    path: str
    key_id: str | None = None
    account_id: str | None = None
    model: str | None = None
    stream: bool = False
    priority_class: str | None = None
    channel: str | None = None
    attempts: int = 0
    status: int = 0
    outcome: str = ""
    prompt_tokens: int = 0
    completion_tokens: int = 0
    queue_ms: float = 0.0
    duration_ms: float = 0.0
    degraded: bool = False
    served_model: str | None = None  # the model that answered: `model`, or one of its fallbacks


# the log line's keys, in order (dataclasses.asdict would deep-copy every value on each request)
RECORD_FIELDS = tuple(f.name for f in fields(RequestRecord))


class Exchange:
    def __init__(self, quota: QuotaService, metrics: GatewayMetrics, request_id: str, path: str,
                 renew_interval: float, trace: RequestTrace = NOOP_REQUEST):
        self.record = RequestRecord(request_id, path)
        self.trace = trace
        self.started = time.monotonic()
        self._quota = quota
        self._metrics = metrics
        self._renew_interval = renew_interval
        self._reservation: Reservation | None = None
        self._renewal: asyncio.Task[None] | None = None
        self._pool: PriorityPool | None = None
        self._sub_account_id: str | None = None
        self.upstream_started: float | None = None  # when the first upstream attempt began
        self.estimated_tokens = 0  # the admission's reservation
        self._capacity: tuple[CapacityHold, Callable[[CapacityHold, int], Awaitable[None]]] | None = None
        self.prefix: RoutedPrefix | None = None  # where its model routes by prefix: learned once served
        self._ended = False

    def identify(self, key: KeyInfo) -> None:
        self.record.key_id, self.record.account_id = key.id, key.account_id
        self._sub_account_id = key.sub_account_id
        self.trace.set_key(key.id, key.account_id, key.sub_account_id)

    def hold(self, reservation: Reservation) -> None:
        """Keep the reservation's concurrency lease alive until `end`."""
        self._reservation = reservation
        self.estimated_tokens = reservation.estimated_tokens
        if reservation.lease_levels:  # no concurrency limit anywhere: no lease to keep alive
            self._renewal = asyncio.create_task(self._renew(reservation))

    def hold_capacity(self, hold: CapacityHold | None,
                      release: Callable[[CapacityHold, int], Awaitable[None]]) -> None:
        """Keep what the request took from the shared channel and model limits, corrected by usage at `end`."""
        if hold is not None:
            self._capacity = (hold, release)

    async def take_slot(self, pool: PriorityPool) -> None:
        queued = time.monotonic()
        with self.trace.queue_wait(pool.name):
            await pool.acquire()
        self._pool = pool
        self.record.priority_class = pool.name
        waited = time.monotonic() - queued
        self.record.queue_ms = round(waited * 1000, 2)
        self._metrics.queue_wait_of(pool.name).observe(waited)

    def first_token(self) -> None:
        """The upstream's answer head (first content token of a stream, or the whole body) has arrived."""
        if self._pool is not None:
            self._pool.note_first_token(time.monotonic() - self.started)
        if self.upstream_started is not None and self.record.channel:
            model = self._metrics.model_label(self.record.model)
            self._metrics.upstream_ttft_of(self.record.channel, model).observe(
                time.monotonic() - self.upstream_started)

    async def end(self, status: int, outcome: str, usage: Usage | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        self.record.status, self.record.outcome = status, outcome
        if self._renewal is not None:
            self._renewal.cancel()
        if self._pool is not None:
            self._pool.release()
        if self._reservation is not None:
            used = usage or Usage()
            self.record.prompt_tokens, self.record.completion_tokens = used.prompt_tokens, used.completion_tokens
            try:
                await self._quota.settle(self._reservation, prompt_tokens=used.prompt_tokens,
                                         completion_tokens=used.completion_tokens, model=self._reservation.model,
                                         cached_tokens=used.cached_tokens, channel=self.record.channel,
                                         outcome=outcome)
            except Exception:  # the answer is already decided; an unsettled reservation expires by its TTL
                log.exception("settling request %s failed", self.record.request_id)
            else:
                self._metrics.settled(self._reservation.account_id, self._sub_account_id, used.prompt_tokens,
                                      used.completion_tokens)
                self._metrics.prompt_cache(self.record.channel, used.prompt_tokens, used.cached_tokens)
                self._metrics.spend.settled(self._reservation, used, self.record.channel)
        if self.prefix is not None and self.record.channel and 200 <= status < 300:
            self.prefix.served(self.record.channel)  # that replica now holds the prompt's KV
        if self._capacity is not None:
            hold, release = self._capacity
            try:
                await release(hold, self.record.prompt_tokens + self.record.completion_tokens)
            except Exception:  # the leases lapse by their TTL
                log.exception("giving back capacity of request %s failed", self.record.request_id)
        self.trace.set_usage(self.record.prompt_tokens, self.record.completion_tokens)
        self.trace.end(status, None if outcome in ("ok", "refused") else outcome)
        now = time.monotonic()
        elapsed = now - self.started
        self.record.duration_ms = round(elapsed * 1000, 2)
        self._metrics.observe(self.record.path, self.record.model, self.record.channel, status, outcome, elapsed)
        if self.upstream_started is not None and self.record.channel:
            model = self._metrics.model_label(self.record.model)
            self._metrics.upstream_latency_of(self.record.channel, model).observe(
                now - self.upstream_started)
        if access_log.isEnabledFor(logging.INFO):
            record = self.record
            access_log.info(json.dumps({name: getattr(record, name) for name in RECORD_FIELDS}, separators=(",", ":")))

    async def _renew(self, reservation: Reservation) -> None:
        while True:
            await asyncio.sleep(self._renew_interval)
            with contextlib.suppress(Exception):  # a missed renewal is retried next round; the TTL is longer
                await self._quota.renew(reservation)
