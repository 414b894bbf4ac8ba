"""The autoscaler's driver in `tidegate up --replicas MIN:MAX`: it reads the replicas' load, asks the decision
(tidegate.stack.autoscale) what to do, and carries it out without blocking the supervisor for long.

A new replica is started on a free port with the same flags, registered as a channel once healthy (model loaded
and warmed up), and only then counts as serving. A replica to remove is drained first: its channel takes no new
request, and the process is stopped once the gateway has removed the channel, which it does when the channel's
requests in flight have finished. One change runs at a time; each decision and each step is one JSON line.
"""

from __future__ import annotations

import enum
import itertools
import json
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import httpx

from tidegate.stack.autoscale import Action, Decision, Sample, ScalePolicy, decide
from tidegate.stack.processes import Child, local_get
from tidegate.stack.replica_channels import REPLICA_PREFIX, ReplicaChannels
from tidegate.stack.replica_metrics import LoadReader


class ReplicaState(enum.Enum):
    STARTING = "starting"
    SERVING = "serving"
    DRAINING = "draining"


@dataclass(slots=True)
class Replica:
    child: Child
    state: ReplicaState
    since: float  # when it entered this state (monotonic)


def minute_of_day() -> int:
    """The local time of day, which the schedule is written in."""
    now = time.localtime()
    return now.tm_hour * 60 + now.tm_min


def _index(replica: Replica) -> int:
    return int(replica.child.name.removeprefix(REPLICA_PREFIX))


def log_event(event: str, **fields: object) -> None:
    print(json.dumps({"event": f"autoscale.{event}", **fields}), flush=True)


class ElasticReplicas:
    """The backend replicas of an elastic `tidegate up`; `tick()` is called from the supervisor's loop.

    `supervised` is the supervisor's own list of children: a replica joins it when started (so a crash is
    restarted like any other child) and leaves it once drained, just before it is stopped.
    """

    def __init__(self, policy: ScalePolicy, make_replica: Callable[[int], Child], channels: ReplicaChannels,
                 supervised: list[Child], clock: Callable[[], float] = time.monotonic,
                 minute: Callable[[], int] = minute_of_day):
        self._policy = policy
        self._make_replica = make_replica
        self._channels = channels
        self._supervised = supervised
        self._clock = clock
        self._minute = minute
        self._replicas: list[Replica] = []
        self._reader = LoadReader()
        settings = policy.settings
        horizon = max(settings.scale_up_window, settings.scale_down_window) + 2 * settings.metrics_interval
        self._samples: deque[Sample] = deque(maxlen=int(horizon / settings.metrics_interval) + 2)
        self._next_read = 0.0
        self._last_change = clock()

    def adopt(self, children: list[Child]) -> None:
        """The replicas started (and registered) with the stack count as serving from now on."""
        now = self._clock()
        self._replicas += [Replica(c, ReplicaState.SERVING, now) for c in children]
        self._last_change = now

    def tick(self) -> None:
        now = self._clock()
        self._advance(now)
        if now >= self._next_read:
            self._next_read = now + self._policy.settings.metrics_interval
            serving = {r.child.name: f"{r.child.url}/metrics" for r in self._in(ReplicaState.SERVING)}
            sample = self._reader.read(serving, self._clock)
            if sample is not None:
                self._samples.append(sample)
        if self._in(ReplicaState.STARTING) or self._in(ReplicaState.DRAINING):
            return  # one change at a time: the next is judged on the load once this one has landed
        serving_count, now = len(self._in(ReplicaState.SERVING)), self._clock()  # the reads took a while
        decision = decide(self._samples, serving_count, self._policy, now, self._minute(), self._last_change)
        if decision.action is not Action.HOLD:
            self._carry_out(decision, serving_count, now)

    def _in(self, state: ReplicaState) -> list[Replica]:
        return [r for r in self._replicas if r.state is state]

    def _carry_out(self, decision: Decision, serving_count: int, now: float) -> None:
        last = self._samples[-1] if self._samples else None
        log_event("decision", action=decision.action.value, replicas=serving_count, to=decision.replicas,
                  reason=decision.reason, waiting=last and last.waiting, running=last and last.running,
                  ttft_p95_s=last and last.ttft_p95)
        if decision.action is Action.UP:
            for _ in range(decision.replicas - serving_count):
                self._start(now)
        else:
            newest_first = sorted(self._in(ReplicaState.SERVING), key=_index, reverse=True)
            for replica in newest_first[:serving_count - decision.replicas]:
                self._drain(replica, now)

    def _start(self, now: float) -> None:
        used = {r.child.name for r in self._replicas}
        child = self._make_replica(next(i for i in itertools.count(1) if f"{REPLICA_PREFIX}{i}" not in used))
        child.start()
        self._supervised.append(child)
        self._replicas.append(Replica(child, ReplicaState.STARTING, now))

    def _drain(self, replica: Replica, now: float) -> None:
        try:
            self._channels.drain(replica.child.name)
        except httpx.HTTPError as exc:  # the gateway is restarting: the next decision will ask again
            log_event("drain_failed", replica=replica.child.name, error=type(exc).__name__)
            return
        replica.state, replica.since = ReplicaState.DRAINING, now
        log_event("draining", replica=replica.child.name)

    def _advance(self, now: float) -> None:
        """Moves each starting or draining replica on when it is ready to move."""
        for replica in self._in(ReplicaState.STARTING):
            child = replica.child
            if self._healthy(child):
                try:
                    self._channels.register(child.name, child.url)
                except httpx.HTTPError as exc:
                    log_event("register_failed", replica=child.name, error=type(exc).__name__)
                    continue  # tried again on the next tick
                replica.state = ReplicaState.SERVING
                log_event("serving", replica=child.name, url=child.url, seconds=round(now - replica.since, 2))
                replica.since = self._last_change = now
            elif now - replica.since > self._policy.settings.replica_ready_timeout:
                log_event("start_failed", replica=child.name, log=str(child.log_path))
                self._remove(replica, now)
        for replica in self._in(ReplicaState.DRAINING):
            try:
                drained = self._channels.drained(replica.child.name)
            except httpx.HTTPError:
                continue
            if drained:
                self._remove(replica, now)
                log_event("stopped", replica=replica.child.name, drain_seconds=round(now - replica.since, 2))

    def _remove(self, replica: Replica, now: float) -> None:
        if replica.child in self._supervised:
            self._supervised.remove(replica.child)  # first, so the supervisor does not restart it
        replica.child.stop()
        self._replicas.remove(replica)
        self._last_change = now

    @staticmethod
    def _healthy(child: Child) -> bool:
        try:
            return child.alive() and local_get(child.health_url).status_code == 200
        except httpx.HTTPError:
            return False
