from __future__ import annotations

import pytest

from limiter import TokenBucket


@pytest.mark.parametrize(("rate", "burst", "seconds"), [(10.0, 5.0, 3.0), (100.0, 20.0, 1.5), (0.5, 1.0, 10.0)])
def test_bucket_admits_rate_times_time_plus_burst(rate: float, burst: float, seconds: float) -> None:
    bucket = TokenBucket(rate, burst)
    admitted = 0
    steps = 10_000
    for step in range(steps + 1):
        if bucket.take(500.0 + seconds * step / steps).ok:
            admitted += 1
    assert abs(admitted - (rate * seconds + burst)) <= 1


def test_refused_take_says_when_the_cost_will_be_there() -> None:
    bucket = TokenBucket(rate=2.0, burst=4.0)
    assert bucket.take(0.0, 4.0).ok
    refused = bucket.take(0.0, 3.0)
    assert not refused.ok and refused.retry_after == pytest.approx(1.5)
    assert bucket.take(1.5, 3.0).ok


def test_cost_above_burst_is_never_admitted() -> None:
    bucket = TokenBucket(rate=1.0, burst=2.0)
    take = bucket.take(100.0, 3.0)
    assert not take.ok and take.retry_after == float("inf")


def test_clock_going_backwards_does_not_mint_tokens() -> None:
    bucket = TokenBucket(rate=1.0, burst=1.0)
    assert bucket.take(10.0).ok
    assert not bucket.take(5.0).ok
    assert not bucket.take(10.5).ok
    assert bucket.take(11.0).ok
