"""The collector as a serving process sets it: what exists is frozen, the young generation waits longer."""

from __future__ import annotations

import gc

from common.heap import settle_for_serving


def test_settling_freezes_what_exists_and_raises_the_young_threshold() -> None:
    before = gc.get_threshold()
    try:
        settle_for_serving(young_threshold=12_345)
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (12_345, before[1], before[2])
    finally:
        gc.unfreeze()  # the test process goes on collecting as before
        gc.set_threshold(*before)
