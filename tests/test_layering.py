"""The tiers meet only over HTTP: pin which packages may import which."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FORBIDDEN = {
    "backend": {"gateway", "quota", "limiter"},  # the backend knows nothing of keys or quotas
    "gateway": {"backend"},
    "quota": {"gateway", "backend", "starlette", "uvicorn", "httpx", "aiohttp"},  # no HTTP in admission logic
    "limiter": {"gateway", "backend", "quota", "starlette", "uvicorn", "httpx", "aiohttp"},
    "config": {"gateway", "backend", "quota", "limiter"},
}


def imported_roots(path: Path) -> set[str]:
    roots = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            roots.add(node.module.split(".")[0])
    return roots


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_stay_within_its_tier(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): sorted(imported_roots(path) & FORBIDDEN[package])
        for path in (ROOT / package).rglob("*.py")
        if imported_roots(path) & FORBIDDEN[package]
    }
    assert offenders == {}
