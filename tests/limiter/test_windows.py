from __future__ import annotations

from limiter import FixedWindow, SlidingWindow


def test_sliding_window_admits_exactly_the_limit_within_the_window() -> None:
    window = SlidingWindow(slots=60)
    admitted = 0
    for step in range(600):  # 10 requests a second for one minute
        now = 1000.0 + step / 10
        if window.check(now, 1, 100).ok:
            window.add(now, 1)
            admitted += 1
    assert admitted == 100


def test_sliding_window_frees_units_a_full_window_after_they_entered() -> None:
    window = SlidingWindow(slots=60)
    window.add(1000.5, 60)
    refused = window.check(1059.9, 1, 60)
    assert not refused.ok and refused.count == 60
    assert abs(refused.retry_after - 0.1) < 1e-6  # slot 1000 leaves at 1060.0
    assert window.check(1060.0, 60, 60).ok


def test_sliding_window_retry_after_waits_for_enough_units_to_leave() -> None:
    window = SlidingWindow(slots=10)
    window.add(100.0, 3)
    window.add(104.0, 5)
    check = window.check(105.0, 4, 10)  # needs 2 more units to leave: slot 100 (3 units) suffices
    assert not check.ok and abs(check.retry_after - 5.0) < 1e-9
    check = window.check(105.0, 9, 10)  # needs slot 104 as well
    assert abs(check.retry_after - 9.0) < 1e-9


def test_sliding_window_cost_above_limit_never_fits() -> None:
    window = SlidingWindow(slots=60)
    check = window.check(0.0, 11, 10)
    assert not check.ok and check.retry_after == 60.0


def test_sliding_window_refund_applies_only_inside_the_window() -> None:
    window = SlidingWindow(slots=60)
    slot = window.add(1000.0, 50)
    window.adjust(slot, -40)
    assert window.total == 10
    window.adjust(slot, -100)  # never below zero
    assert window.total == 0
    old = window.add(1000.0, 5)
    window.add(1100.0, 1)  # slot `old` has left the window
    window.adjust(old, 7)
    assert window.total == 1


def test_fixed_window_resets_on_a_new_period_from_its_seed() -> None:
    window = FixedWindow()
    assert window.roll(5)
    window.count += 90
    assert not window.fits(11, 100) and window.fits(10, 100)
    assert not window.roll(5)
    assert window.roll(6, seed=7) and window.count == 7
    window.adjust(5, -100)  # an old period's refund does not touch the new one
    assert window.count == 7
