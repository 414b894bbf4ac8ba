"""Request scheduling: closed loop at a fixed concurrency, or open loop at a Poisson/gamma arrival rate.

No coordinated omission: a request's clock starts when the profile scheduled it, not when the generator
got round to sending it, and the gap between the two is reported as client-side queueing. In open loop a
generator that falls behind its schedule says so (achieved versus offered rate) instead of quietly
offering less load.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np

from bench.client import StreamingClient, Target
from bench.metrics import Slo, summarize
from bench.progress import Progress
from bench.records import MeasuredRequest
from bench.workloads import Conversation, Message, Workload

# An open-loop generator keeps up when it sends at least this share of the offered rate.
KEEP_UP_RATIO = 0.95
# Mean client-side queueing above this share of mean TTFT (and CLIENT_BOUND_MS) means the figures
# describe the client as much as the server.
CLIENT_BOUND_SHARE = 0.2
CLIENT_BOUND_MS = 10.0


# runs one conversation whose first turn is scheduled at the given second of the run
Converse = Callable[[Conversation, float], Coroutine[Any, Any, None]]


class ProfileError(ValueError):
    """A load profile that does not describe a run."""


@dataclass(slots=True)
class LoadProfile:
    """How load is offered: `concurrency` (closed loop) or `rate` requests/s (open loop), for
    `num_requests` requests or `duration` seconds, after `warmup` discarded requests."""

    concurrency: int | None = None
    rate: float | None = None
    burstiness: float = 1.0  # gamma shape; 1.0 is Poisson, below 1 burstier
    num_requests: int | None = None
    duration: float | None = None
    warmup: int = 0
    seed: int = 0
    max_connections: int | None = None  # None: one connection per in-flight request

    def __post_init__(self) -> None:
        if (self.concurrency is None) == (self.rate is None):
            raise ProfileError("give exactly one of --concurrency or --rate")
        if self.concurrency is not None and self.concurrency < 1:
            raise ProfileError("--concurrency must be at least 1")
        if self.rate is not None and not (self.rate > 0 and math.isfinite(self.rate)):
            raise ProfileError("--rate must be a positive number of requests per second")
        if (self.num_requests is None) == (self.duration is None):
            raise ProfileError("give exactly one of --num-requests or --duration")
        if self.num_requests is not None and self.num_requests < 1:
            raise ProfileError("--num-requests must be at least 1")
        if self.duration is not None and self.duration <= 0:
            raise ProfileError("--duration must be positive")
        if self.burstiness <= 0 or self.warmup < 0:
            raise ProfileError("--burstiness must be positive and --warmup non-negative")
        if self.max_connections is not None and self.max_connections < 1:
            raise ProfileError("--max-connections must be at least 1")


@dataclass(slots=True)
class RunResult:
    """Everything one measured run produced; `summary()` turns it into the JSON figures."""

    profile: LoadProfile
    records: list[MeasuredRequest] = field(default_factory=list)
    duration: float = 0.0
    started_at: str = ""

    def summary(self, slo: Slo | None = None) -> dict[str, Any]:
        out: dict[str, Any] = {
            "date": self.started_at,
            "max_concurrency": self.profile.concurrency,
            "request_rate": self.profile.rate,
            "burstiness": self.profile.burstiness,
            "num_prompts": len(self.records),
        }
        out.update(summarize(self.records, self.duration, slo))
        out.update(self.pacing())
        queue = out["mean_client_queue_ms"]
        out["client_bound"] = queue > CLIENT_BOUND_MS and queue > CLIENT_BOUND_SHARE * out["mean_ttft_ms"]
        return out

    def pacing(self) -> dict[str, Any]:
        """Offered versus achieved send rate of conversation starts (first turns)."""
        first = [r for r in self.records if r.turn == 0]
        scheduled = sorted(r.scheduled for r in first)
        sent = sorted(r.sent for r in first if r.sent is not None)
        offered = _rate(scheduled) if self.profile.rate is not None else None
        achieved = _rate(sent) if len(sent) > 1 else 0.0
        kept_up = offered is None or len(scheduled) < 2 or achieved >= KEEP_UP_RATIO * offered
        return {"requested_rate": self.profile.rate, "offered_rate": offered, "achieved_rate": achieved,
                "generator_kept_up": kept_up}


def _rate(times: list[float]) -> float:
    span = times[-1] - times[0] if len(times) > 1 else 0.0
    return (len(times) - 1) / span if span > 0 else 0.0


def arrival_times(rate: float, burstiness: float, seed: int, duration: float | None = None) -> Iterator[float]:
    """Send times in seconds from the start: the first at 0, then gamma gaps with mean 1/rate."""
    rng = np.random.default_rng(seed)
    at = 0.0
    while duration is None or at < duration:
        yield at
        at += float(rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness)))


class LoadGenerator:
    """Runs a workload against a target under a load profile."""

    def __init__(self, target: Target, workload: Workload, profile: LoadProfile,
                 progress: Progress | None = None) -> None:
        self.target = target
        self.workload = workload
        self.profile = profile
        self.progress = progress

    async def run(self) -> RunResult:
        client = StreamingClient(self.target, self.profile.max_connections)
        try:
            if self.profile.warmup:
                warm = LoadProfile(concurrency=min(self.profile.warmup, self.profile.concurrency
                                                   or math.ceil(self.profile.rate or 1)),
                                   num_requests=self.profile.warmup)
                await self._measure(client, warm, None)
            return await self._measure(client, self.profile, self.progress)
        finally:
            await client.aclose()

    def _conversations(self, limit: int | None) -> Iterator[Conversation]:
        """The workload's conversations, cut so that their turns add up to `limit` requests."""
        stream = self.workload.conversations()
        if limit is None:
            yield from stream
            return
        left = limit
        for conversation in stream:
            yield conversation[:left]
            left -= len(conversation[:left])
            if left == 0:
                return

    async def _measure(self, client: StreamingClient, profile: LoadProfile,
                       progress: Progress | None) -> RunResult:
        result = RunResult(profile, started_at=datetime.now(UTC).isoformat(timespec="seconds"))
        # prompts are built before the clock starts wherever the run's size is known, so that building
        # them never delays a send
        conversations = self._conversations(profile.num_requests)
        arrivals: list[float] = []
        if profile.num_requests is not None:
            planned = list(conversations)
            if profile.rate is not None:
                arrivals = list(itertools.islice(
                    arrival_times(profile.rate, profile.burstiness, profile.seed), len(planned)))
            conversations = iter(planned)
        elif profile.rate is not None:
            arrivals = list(arrival_times(profile.rate, profile.burstiness, profile.seed, profile.duration))
            conversations = iter(list(itertools.islice(conversations, len(arrivals))))
        t0 = time.perf_counter()

        async def converse(conversation: Conversation, scheduled: float) -> None:
            history: list[Message] = []
            for turn, spec in enumerate(conversation):
                record = MeasuredRequest(index=len(result.records), scheduled=scheduled, turn=turn,
                                       input_tokens=spec.input_tokens, requested_output_tokens=spec.output_len)
                result.records.append(record)
                await client.send(self.target.body(spec, history), record, t0)
                if progress is not None:
                    progress.update(record)
                if not record.ok or not isinstance(spec.prompt, str):
                    return  # a broken conversation ends; its later turns are never sent
                history += [{"role": "user", "content": spec.prompt}, {"role": "assistant", "content": record.text}]
                scheduled = record.end if record.end is not None else time.perf_counter() - t0

        if progress is not None:
            progress.start(t0)
        try:
            if profile.concurrency is not None:
                await self._closed_loop(conversations, converse, profile, t0)
            else:
                await self._open_loop(conversations, converse, arrivals, t0)
        finally:
            if progress is not None:
                progress.close()
        result.duration = time.perf_counter() - t0
        return result

    async def _closed_loop(self, conversations: Iterator[Conversation], converse: Converse,
                           profile: LoadProfile, t0: float) -> None:
        async def worker() -> None:
            # workers share one iterator; next() never awaits, so no two take the same conversation
            for conversation in conversations:
                now = time.perf_counter() - t0
                if profile.duration is not None and now >= profile.duration:
                    return
                await converse(conversation, now)

        assert profile.concurrency is not None
        await asyncio.gather(*(worker() for _ in range(profile.concurrency)))

    async def _open_loop(self, conversations: Iterator[Conversation], converse: Converse,
                         arrivals: list[float], t0: float) -> None:
        tasks: list[asyncio.Task[None]] = []
        for at, conversation in zip(arrivals, conversations, strict=False):
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(converse(conversation, at)))
        await asyncio.gather(*tasks)
