"""Modules stay small enough to read in one sitting: no product module over 350 lines."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tidegate", "gateway", "backend", "limiter", "quota", "config", "bench")
MAX_LINES = 350


def test_no_product_module_is_over_350_lines() -> None:
    sizes = {
        str(path.relative_to(ROOT)): len(path.read_text().splitlines())
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
    }
    assert len(sizes) > 50  # the walk found the tree
    assert {name: lines for name, lines in sizes.items() if lines > MAX_LINES} == {}
