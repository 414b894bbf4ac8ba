"""The allocator tuning applies on glibc Linux and can be applied again."""

from __future__ import annotations

import sys

import pytest

from backend.host_memory import keep_freed_memory


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")
def test_tuning_applies_and_is_idempotent() -> None:
    assert keep_freed_memory() is True
    assert keep_freed_memory() is True
