"""The package's public surface is exactly `__all__`, sorted, and every name in it resolves."""

from __future__ import annotations

import bench


def test_all_is_sorted_and_resolves() -> None:
    assert bench.__all__ == sorted(bench.__all__)
    for name in bench.__all__:
        assert getattr(bench, name) is not None, name
