"""The package's public surface is exactly `__all__`, sorted, and every name in it is bench's own."""

from __future__ import annotations

import bench


def test_all_is_sorted_complete_and_names_only_bench_code() -> None:
    assert bench.__all__ == sorted(bench.__all__)
    public = {name for name, value in vars(bench).items()
              if not name.startswith("_") and name != "annotations" and not isinstance(value, type(bench))}
    assert set(bench.__all__) == public  # nothing importable from `bench` is left out of __all__, or missing
    for name in bench.__all__:
        assert getattr(bench, name).__module__.startswith("bench."), name  # bench's own, not a re-export
