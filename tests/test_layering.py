"""The tiers meet only over HTTP and every package imports downward: pin which packages may import which, the
gateway's and quota's floors, quota's one public surface, no import circle, and folders of at most 15 modules.
Each rule reads a source tree from a root, so that a test can plant a violation in a tree of its own."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
HTTP = {"starlette", "uvicorn", "httpx", "aiohttp"}
FIRST_PARTY = {"gateway", "backend", "quota", "limiter", "common", "config", "tidegate", "bench"}
PRODUCT = sorted(FIRST_PARTY)
FORBIDDEN = {
    "backend": {"gateway", "quota", "limiter"},  # the backend knows nothing of keys or quotas
    "gateway": {"backend"},
    "quota": {"gateway", "backend", *HTTP},  # no HTTP in admission logic
    "limiter": {"gateway", "backend", "quota", *HTTP},
    "common": {"gateway", "backend", "quota", "limiter", "tidegate"},  # below both tiers
    "config": FIRST_PARTY - {"config"},  # the bottom: settings read by everyone, importing no one
    # The backend's layers: server -> engine -> executor; loading builds the executor's model and the
    # tokenizer; nothing below the server knows HTTP.
    "backend/engine": {"backend.server", *HTTP},
    "backend/executor": {"backend.server", "backend.engine", "backend.loading", *HTTP},
    "backend/loading": {"backend.server", "backend.engine", *HTTP},
    # The executor's folders: runner.py and cuda_graphs.py use them; model/ uses attention/, cpu/ and kernels/;
    # attention/ uses cpu/ and kernels/; sample/, cpu/ and kernels/ are leaves.
    "backend/executor/model": {"backend.executor.runner", "backend.executor.cuda_graphs", "backend.executor.sample"},
    "backend/executor/attention": {"backend.executor.runner", "backend.executor.cuda_graphs", "backend.executor.model",
                                   "backend.executor.sample"},
    "backend/executor/sample": {"backend.executor.runner", "backend.executor.cuda_graphs", "backend.executor.model",
                                "backend.executor.attention", "backend.executor.cpu", "backend.executor.kernels"},
    "backend/executor/cpu": {"backend.executor.runner", "backend.executor.cuda_graphs", "backend.executor.model",
                             "backend.executor.attention", "backend.executor.sample", "backend.executor.kernels"},
    "backend/executor/kernels": {"backend.executor.runner", "backend.executor.cuda_graphs", "backend.executor.model",
                                 "backend.executor.attention", "backend.executor.sample", "backend.executor.cpu"},
}
# The gateway's folders, each with the folders it may import: app -> apis -> path -> channels -> observe,
# admin -> channels, apis and admin -> mcp -> path (a tool call takes the request path's admission), and
# batch -> apis (a batch line is served by the inbound API it names). Modules outside a folder are leaves everyone
# may import, but the app and its server.
GATEWAY_BELOW = {
    "batch": {"apis", "path", "channels", "observe"},
    "apis": {"path", "channels", "observe", "mcp"},
    "mcp": {"path", "channels", "observe"},
    "path": {"channels", "observe"},
    "channels": {"observe"},
    "admin": {"channels", "observe", "mcp"},
    "observe": set(),
}
GATEWAY_TOP = {"gateway", "gateway.app", "gateway.server", "gateway.worker_settings"}
# quota's floors, top to bottom: a module imports its own floor or those below
QUOTA_FLOORS = ("quota", "quota.stores", "quota.admin", "quota.rules")  # and below them the leaves:
QUOTA_LEAVES = {"quota.records", "quota.money", "quota.errors"}
MAX_MODULES = 15  # per folder, __init__.py aside


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


def module_name(root: Path, path: Path) -> str:
    parts = path.relative_to(root).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path, packages: list[str]) -> dict[str, set[str]]:
    """Each product module -> the product modules it imports (relative imports resolved, `from a import b` counted
    as `a.b` when b is a module)."""
    files = {module_name(root, path): path for package in packages for path in (root / package).rglob("*.py")}

    def known(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str | None] = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                targets.update(known(alias.name) for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, base] if base else anchor)
                targets.update(known(f"{base}.{alias.name}") for alias in node.names)
        graph[module] = {t for t in targets if t is not None and t != module}
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            node, edges = work[-1]
            for target in edges:
                if target not in index:
                    index[target] = low[target] = len(index)
                    stack.append(target)
                    work.append((target, iter(sorted(graph.get(target, ())))))
                    break
                if target in stack:
                    low[node] = min(low[node], index[target])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = set()
                    while True:
                        member = stack.pop()
                        component.add(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        cycles.append(component)
    return cycles


def gateway_group(module: str) -> str:
    """A gateway module's folder, `top` for the app and its server, `leaf` for any other."""
    if module in GATEWAY_TOP:
        return "top"
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in GATEWAY_BELOW else "leaf"


def gateway_upward_imports(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, targets in graph.items():
        if not module.startswith("gateway."):
            continue
        group = gateway_group(module)
        for target in targets:
            if group == "top" or not (target == "gateway" or target.startswith("gateway.")):
                continue
            to = gateway_group(target)
            if to != group and to != "leaf" and (group == "leaf" or to not in GATEWAY_BELOW[group]):
                found.append(f"{module} -> {target}")
    return sorted(found)


def quota_floor(module: str) -> int:
    if module in QUOTA_LEAVES:
        return len(QUOTA_FLOORS)
    return max(i for i, floor in enumerate(QUOTA_FLOORS) if module == floor or module.startswith(f"{floor}."))


def quota_upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return sorted(f"{module} -> {target}" for module, targets in graph.items() if module.startswith("quota")
                  for target in targets if target.startswith("quota") and quota_floor(target) < quota_floor(module))


def quota_reached_into(graph: dict[str, set[str]]) -> list[str]:
    """Imports of quota's submodules from outside quota: the gateway and the CLI use `quota` alone, and nothing
    outside quota touches its stores."""
    return sorted(f"{module} -> {target}" for module, targets in graph.items() if module.split(".")[0] != "quota"
                  for target in targets if target.startswith("quota.")
                  and (module.split(".")[0] in ("gateway", "tidegate") or target.startswith("quota.stores")))


def crowded_folders(root: Path, packages: list[str]) -> dict[str, int]:
    counts = {}
    for package in packages:
        for folder in [root / package, *(p for p in (root / package).rglob("*") if p.is_dir())]:
            modules = [p for p in folder.glob("*.py") if p.name != "__init__.py"]
            if len(modules) > MAX_MODULES:
                counts[str(folder.relative_to(root))] = len(modules)
    return counts


def exported(init: Path) -> tuple[list[str], set[str]]:
    """An __init__'s `__all__` and the names it imports."""
    tree = ast.parse(init.read_text())
    listed: list[str] = []
    imported = set()
    for node in tree.body:
        if isinstance(node, ast.ImportFrom):
            imported.update(alias.asname or alias.name for alias in node.names)
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            listed = [ast.literal_eval(element) for element in node.value.elts]  # type: ignore[attr-defined]
    return listed, imported - {"annotations"}


def isort_order(names: list[str]) -> list[str]:
    """ruff's order for `__all__` (RUF022): CONSTANTS, then Classes, then functions, each alphabetical."""
    return sorted(names, key=lambda n: (not n.isupper(), not n[:1].isupper(), n))


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_stay_within_its_layer(package: str) -> None:
    offenders = {
        str(path.relative_to(ROOT)): found
        for path in (ROOT / package).rglob("*.py")
        if (found := forbidden_imports(path, FORBIDDEN[package]))
    }
    assert offenders == {}


def test_the_gateway_folders_import_only_downward() -> None:
    assert gateway_upward_imports(import_graph(ROOT, ["gateway"])) == []


def test_quota_imports_only_downward() -> None:
    assert quota_upward_imports(import_graph(ROOT, ["quota"])) == []


def test_the_gateway_and_the_cli_use_quotas_public_surface_and_no_one_else_its_stores() -> None:
    assert quota_reached_into(import_graph(ROOT, PRODUCT)) == []


def test_quota_exports_a_sorted_complete_surface() -> None:
    listed, imported = exported(ROOT / "quota" / "__init__.py")
    assert listed == isort_order(listed)
    assert set(listed) == imported


def test_no_import_circle_in_the_product() -> None:
    assert import_cycles(import_graph(ROOT, PRODUCT)) == []


def test_no_folder_holds_more_than_15_modules() -> None:
    assert crowded_folders(ROOT, PRODUCT) == {}


def test_the_layering_check_sees_a_forbidden_import(tmp_path: Path) -> None:
    module = tmp_path / "runner.py"
    module.write_text("from backend.engine.sequence import Sequence\nfrom backend import server\nimport httpx\n")
    assert forbidden_imports(module, FORBIDDEN["backend/executor"]) == [
        "backend.engine.sequence",
        "backend.engine.sequence.Sequence",
        "backend.server",
        "httpx",
    ]
    (tmp_path / "common.py").write_text("from gateway.errors import ApiError\nfrom config import GatewaySettings\n")
    assert forbidden_imports(tmp_path / "common.py", FORBIDDEN["common"]) == ["gateway.errors",
                                                                             "gateway.errors.ApiError"]
    (tmp_path / "config.py").write_text("from common.request_id import request_id\n")
    assert forbidden_imports(tmp_path / "config.py", FORBIDDEN["config"]) != []


def plant(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


def test_the_gateway_check_sees_an_upward_import(tmp_path: Path) -> None:
    root = plant(tmp_path, {
        "gateway/__init__.py": "", "gateway/errors.py": "", "gateway/app.py": "from gateway.apis import openai\n",
        "gateway/apis/openai.py": "from gateway.path.proxy import Proxy\n",
        "gateway/path/proxy.py": "from gateway.apis.openai import CHAT\nfrom gateway.errors import ApiError\n",
        "gateway/observe/metrics.py": "from gateway.channels.router import Router\n",
        "gateway/channels/router.py": "from gateway.observe import metrics\n",
        "gateway/admin/api.py": "from gateway.path import proxy\n",
        "gateway/auth.py": "from gateway.channels.router import Router\n",
    })
    assert gateway_upward_imports(import_graph(root, ["gateway"])) == [
        "gateway.admin.api -> gateway.path.proxy",
        "gateway.auth -> gateway.channels.router",
        "gateway.observe.metrics -> gateway.channels.router",
        "gateway.path.proxy -> gateway.apis.openai",
    ]


def test_the_quota_checks_see_an_upward_import_and_a_reach_into_its_submodules(tmp_path: Path) -> None:
    root = plant(tmp_path, {
        "quota/__init__.py": "from quota.stores.open import open_store\n",
        "quota/money.py": "", "quota/records.py": "from quota.money import Price\n",
        "quota/stores/open.py": "from quota.admin.accounts import QuotaAdmin\n",
        "quota/admin/accounts.py": "from quota.rules.prices import parse_price\n",
        "quota/rules/prices.py": "from quota.admin.accounts import parse_time\n",
        "gateway/auth.py": "from quota import KeyInfo\nfrom quota.rules.prices import parse_price\n",
        "backend/server.py": "import quota.stores.open\n",
    })
    assert quota_upward_imports(import_graph(root, ["quota"])) == ["quota.rules.prices -> quota.admin.accounts"]
    assert quota_reached_into(import_graph(root, PRODUCT)) == ["backend.server -> quota.stores.open", "gateway.auth -> quota.rules.prices"]
    (root / "quota" / "__init__.py").write_text("from quota.money import Price, MICRO\n__all__ = ['Price']\n")
    listed, imported = exported(root / "quota" / "__init__.py")
    assert listed == isort_order(listed) and set(listed) != imported
    assert isort_order(["open_store", "Price", "MICRO"]) == ["MICRO", "Price", "open_store"]


def test_the_circle_check_sees_a_circle(tmp_path: Path) -> None:
    root = plant(tmp_path, {
        "limiter/__init__.py": "", "limiter/a.py": "from limiter.b import B\n", "limiter/b.py": "from . import c\n",
        "limiter/c.py": "import limiter.a\n", "limiter/d.py": "from limiter import a\n",
    })
    assert import_cycles(import_graph(root, ["limiter"])) == [{"limiter.a", "limiter.b", "limiter.c"}]


def test_the_folder_check_sees_a_crowded_folder(tmp_path: Path) -> None:
    root = plant(tmp_path, {f"bench/x/m{i}.py": "" for i in range(MAX_MODULES + 1)} | {"bench/x/__init__.py": ""})
    assert crowded_folders(root, ["bench"]) == {"bench/x": MAX_MODULES + 1}
