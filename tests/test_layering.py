"""The tiers meet only over HTTP, and the backend's layers import downward: pin which packages may import which."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HTTP = {"starlette", "uvicorn", "httpx", "aiohttp"}
FORBIDDEN = {
    "backend": {"gateway", "quota", "limiter"},  # the backend knows nothing of keys or quotas
    "gateway": {"backend"},
    "quota": {"gateway", "backend", *HTTP},  # no HTTP in admission logic
    "limiter": {"gateway", "backend", "quota", *HTTP},
    "config": {"gateway", "backend", "quota", "limiter"},
    # The backend's layers: server -> engine -> executor; loading builds the executor's model and the
    # tokenizer; nothing below the server knows HTTP.
    "backend/engine": {"backend.server", *HTTP},
    "backend/executor": {"backend.server", "backend.engine", "backend.loading", *HTTP},
    "backend/loading": {"backend.server", "backend.engine", *HTTP},
}


def imported_modules(path: Path) -> set[str]:
    """Every module a file imports, and for `from a import b` also `a.b` (b may be a submodule)."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def forbidden_imports(path: Path, forbidden: set[str]) -> list[str]:
    return sorted(
        name
        for name in imported_modules(path)
        if any(name == banned or name.startswith(f"{banned}.") for banned in forbidden)
    )


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_stay_within_its_layer(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in (ROOT / package).rglob("*.py")
        if (found := forbidden_imports(path, FORBIDDEN[package]))
    }
    assert offenders == {}


def test_the_layering_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "runner.py"
    module.write_text("from backend.engine.sequence import Sequence\nfrom backend import server\nimport httpx\n")
    assert forbidden_imports(module, FORBIDDEN["backend/executor"]) == [
        "backend.engine.sequence",
        "backend.engine.sequence.Sequence",
        "backend.server",
        "httpx",
    ]
