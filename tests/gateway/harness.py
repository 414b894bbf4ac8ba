"""A real gateway on loopback inside the test's event loop, with admin and OpenAI clients for it."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any, cast

import httpx
import uvicorn
from openai import AsyncOpenAI
from starlette.applications import Starlette

from config import GatewaySettings
from gateway import create_app
from gateway.app import Gateway
from gateway.server import uvicorn_options
from tests.servers import free_port

ADMIN_KEY = "gateway-tests-admin-7f3c9a1e5b2d8046c1e9f0a3"  # 32+ characters, as the gateway requires


@dataclass
class GatewayHarness:
    settings: GatewaySettings
    port: int = field(default_factory=free_port)
    _server: uvicorn.Server | None = None
    _task: asyncio.Task[None] | None = None
    admin: httpx.AsyncClient = field(init=False)
    app: Starlette = field(init=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> GatewayHarness:
        self.app = create_app(self.settings)
        config = uvicorn.Config(self.app, host="127.0.0.1", port=self.port, log_level="warning",
                                timeout_graceful_shutdown=1, **uvicorn_options(self.settings))
        self._server = uvicorn.Server(config)
        self._task = asyncio.create_task(self._server.serve())
        while not self._server.started:
            if self._task.done():
                self._task.result()
            await asyncio.sleep(0.01)
        self.admin = httpx.AsyncClient(base_url=self.url, headers={"authorization": f"Bearer {ADMIN_KEY}"})
        return self

    def state(self) -> Gateway:
        """The running gateway's parts, for a test that plants a fault in one of them."""
        return cast(Gateway, self.app.state.gateway)

    async def stop(self) -> None:
        await self.admin.aclose()
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            await asyncio.wait_for(self._task, 10)

    async def account(self, quota: dict[str, int] | None = None) -> str:
        response = await self.admin.post("/admin/accounts", json={"name": "acme", "quota": quota})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    async def sub_account(self, account_id: str, quota: dict[str, int] | None = None) -> str:
        response = await self.admin.post(f"/admin/accounts/{account_id}/sub-accounts",
                                         json={"name": "team", "quota": quota})
        assert response.status_code == 201, response.text
        return str(response.json()["id"])

    async def key(self, **fields: Any) -> tuple[str, str]:
        """(key id, secret) of a new key; an account is created when none is named."""
        if "account_id" not in fields and "sub_account_id" not in fields:
            fields["account_id"] = await self.account()
        response = await self.admin.post("/admin/keys", json=fields)
        assert response.status_code == 201, response.text
        return str(response.json()["id"]), str(response.json()["key"])

    def client(self, secret: str, timeout: float = 20.0) -> AsyncOpenAI:
        return AsyncOpenAI(base_url=f"{self.url}/v1", api_key=secret, max_retries=0, timeout=timeout)

    async def usage(self, **query: str) -> dict[str, Any]:
        response = await self.admin.get("/admin/usage", params=query)
        assert response.status_code == 200, response.text
        return dict(response.json())


def settings_for(tmp_path: Any, upstream_urls: list[str], **overrides: Any) -> GatewaySettings:
    channels = [{"name": f"c{i}", "base_url": url, "models": {"smollm2": "upstream-smollm2"}}
                for i, url in enumerate(upstream_urls)]
    values: dict[str, Any] = {"admin_key": ADMIN_KEY, "data_dir": str(tmp_path / "store"), "channels": channels,
                              "health_check_interval": 60.0, **overrides}
    return GatewaySettings.model_validate(values)
