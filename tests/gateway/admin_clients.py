"""Clients for a gateway process's admin API, one per admin identity, and the app's own admin route table."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
from starlette.routing import Route
from starlette.testclient import TestClient

from config import GatewaySettings
from gateway import create_app
from gateway.admin.console import CONSOLE_PATH
from tests.gateway.harness import ADMIN_KEY

PATH_PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")


@dataclass
class AdminGateway:
    url: str
    clients: list[httpx.Client] = field(default_factory=list)

    def client(self, admin_key: str = ADMIN_KEY, local_address: str | None = None) -> httpx.Client:
        """An HTTP client sending `admin_key` (or an API key), from `local_address` when given (127.0.0.x)."""
        transport = httpx.HTTPTransport(local_address=local_address) if local_address else None
        client = httpx.Client(base_url=self.url, headers={"authorization": f"Bearer {admin_key}"}, timeout=30,
                              transport=transport)
        self.clients.append(client)
        return client

    def call(self, method: str, path: str, body: dict[str, Any] | None = None, admin_key: str = ADMIN_KEY,
             expect: int = 200) -> Any:
        response = self.client(admin_key).request(method, path, json=body)
        assert response.status_code == expect, f"{method} {path}: {response.status_code} {response.text}"
        return response.json()

    def admin_key(self, role: str, account_id: str | None = None) -> tuple[str, str]:
        """(id, secret) of a new admin key, created by the bootstrap owner."""
        created = self.call("POST", "/admin/admin-keys", {"role": role, "account_id": account_id, "name": role},
                            expect=201)
        return created["id"], created["key"]


def admin_routes(workdir: Path) -> list[tuple[str, str]]:
    """Every (method, path template) of the admin API, read from a freshly built app's own routes, so that
    a route added later is covered without a test change."""
    settings = GatewaySettings(admin_key=ADMIN_KEY, data_dir=workdir)
    with TestClient(create_app(settings)) as started:
        routes = started.app.router.routes  # type: ignore[attr-defined]
        return sorted((method, route.path) for route in routes if isinstance(route, Route)
                      and route.path.startswith("/admin/") and not route.path.startswith(CONSOLE_PATH)
                      for method in (route.methods or ()) if method != "HEAD")


def filled(path: str, values: dict[str, str]) -> str:
    """The path with each {param} replaced by values[param] (or "x")."""
    return PATH_PARAM.sub(lambda m: values.get(m[1], "x"), path)
