"""The allocator tuning applies on glibc Linux; work handed to a passing thread returns or raises in the caller."""

from __future__ import annotations

import sys
import threading

import pytest

from backend.engine.host import in_passing_thread, keep_freed_memory


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
