"""The allocator tuning applies on glibc Linux; work handed to a passing thread returns or raises in the caller;
collection pauses around a load, and what a loaded server holds is frozen out of later collections."""

from __future__ import annotations

import gc
import sys
import threading

import pytest

from backend.engine.host import collector_paused, freeze_loaded_objects, in_passing_thread, keep_freed_memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_tuning_applies_and_is_idempotent() -> None:
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True


def test_passing_thread_returns_the_result_from_another_thread() -> None:
    caller = threading.get_ident()
    assert in_passing_thread(threading.get_ident) != caller


def test_passing_thread_raises_in_the_caller() -> None:
    def fail() -> None:
        raise ValueError("bad model")

    with pytest.raises(ValueError, match="bad model"):
        in_passing_thread(fail)


def test_collection_pauses_inside_and_resumes_after_even_on_error() -> None:
    assert gc.isenabled()
    with pytest.raises(ValueError, match="bad model"), collector_paused():
        assert not gc.isenabled()
        raise ValueError("bad model")
    assert gc.isenabled()


def test_frozen_objects_are_out_of_the_collections_reach() -> None:
    loaded = [[i] for i in range(1000)]
    try:
        freeze_loaded_objects()
        assert gc.get_freeze_count() >= len(loaded)
    finally:
        gc.unfreeze()
