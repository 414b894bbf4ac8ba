"""The circuit breaker: opening, cooling down, one half-open probe, closing."""

from __future__ import annotations

from config import Breaker
from gateway.channels.breaker import BreakerState, CircuitBreaker


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_consecutive_failures_open_then_one_probe_after_cooldown_closes_it() -> None:
    clock = Clock()
    breaker = CircuitBreaker(Breaker(consecutive_failures=3, cooldown=10), clock)
    for _ in range(3):
        assert breaker.acquire()
        breaker.record(False)
    assert breaker.state is BreakerState.open and not breaker.available()
    clock.now += 10
    assert breaker.state is BreakerState.half_open
    assert breaker.acquire() and not breaker.acquire()  # only one probe at a time
    breaker.record(True)
    assert breaker.state is BreakerState.closed and breaker.acquire()


def test_a_failed_probe_reopens_for_another_cooldown() -> None:
    clock = Clock()
    breaker = CircuitBreaker(Breaker(consecutive_failures=1, cooldown=5), clock)
    breaker.record(False)
    clock.now += 5
    assert breaker.acquire()
    breaker.record(False)
    assert breaker.state is BreakerState.open
    clock.now += 4.9
    assert not breaker.available()


def test_an_abandoned_probe_lets_the_next_request_probe() -> None:
    clock = Clock()
    breaker = CircuitBreaker(Breaker(consecutive_failures=1, cooldown=1), clock)
    breaker.record(False)
    clock.now += 1
    assert breaker.acquire()
    breaker.abandon()
    assert breaker.acquire()


def test_a_failure_rate_over_the_window_opens_without_consecutive_failures() -> None:
    clock = Clock()
    breaker = CircuitBreaker(Breaker(consecutive_failures=100, failure_rate=0.5, min_requests=10, window=30), clock)
    for i in range(10):
        breaker.record(i % 2 == 0)
        clock.now += 1
    assert breaker.state is BreakerState.open
