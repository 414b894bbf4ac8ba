"""The admin console's Tools section in headless Chromium against a real gateway process and a real MCP server:
an operator registers the server, sees its tools, and sees a tenant's tool calls counted; an account admin does
not see the section at all."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import Browser, expect, sync_playwright

from tests.gateway.mcp.conftest import ToolServers, mcp_client
from tests.reliability.processes import ADMIN_KEY, GatewayProcess

CHROMIUM = "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium")


@pytest.fixture
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run"])
        yield browser
        browser.close()


@pytest.fixture
def gateway(tmp_path: Path) -> Iterator[GatewayProcess]:
    process = GatewayProcess.create(tmp_path, [], auth_cache_ttl=0)
    process.start(health_timeout=60)
    yield process
    process.stop()


async def call_echo(url: str, secret: str) -> None:
    async with mcp_client(url, secret) as client:
        await client.call_tool("alpha__echo", {"text": "hi"})


def test_an_operator_registers_a_server_sees_its_tools_and_a_tenants_calls(
        tool_servers: ToolServers, gateway: GatewayProcess, browser: Browser, tmp_path: Path) -> None:
    alpha = tool_servers("alpha")
    page = browser.new_page(viewport={"width": 1200, "height": 1600})
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(f"{gateway.url}/admin/ui")
    page.fill("#admin-key", ADMIN_KEY)
    page.click("#signin button[type=submit]")
    expect(page.locator("#tools")).to_be_visible()
    page.fill("#add-mcp-server input[name=name]", "alpha")
    page.fill("#add-mcp-server input[name=url]", f"{alpha.url}/mcp")
    page.click("#add-mcp-server button[type=submit]")
    row = page.locator("#mcp-servers-table tbody tr[data-server=alpha]")
    expect(row.locator("td.tools")).to_contain_text("alpha__echo")
    expect(row.locator("td.breaker")).to_have_text("closed")

    _, secret = gateway.new_key()
    with ThreadPoolExecutor(1) as thread:  # off the thread where Playwright runs its own event loop
        thread.submit(asyncio.run, call_echo(gateway.url, secret)).result()
    page.reload()  # signed in again from the session's key; the table reads usage anew
    calls = page.locator("#mcp-calls-table tbody tr[data-tool=alpha__echo]")
    expect(calls).to_have_count(1, timeout=15_000)
    expect(calls.locator("td").nth(2)).to_have_text("1")
    page.screenshot(path=str(tmp_path / "tools.png"), full_page=True)

    admin = {"authorization": f"Bearer {ADMIN_KEY}"}
    account_id = httpx.get(f"{gateway.url}/admin/accounts", headers=admin).json()["data"][0]["id"]
    tenant_admin = httpx.post(f"{gateway.url}/admin/admin-keys", headers=admin, json={
        "role": "account_admin", "account_id": account_id}).json()["key"]
    tenant = browser.new_page()
    tenant.goto(f"{gateway.url}/admin/ui")
    tenant.fill("#admin-key", tenant_admin)
    tenant.click("#signin button[type=submit]")
    expect(tenant.locator("#app")).to_be_visible()
    expect(tenant.locator("#tools")).to_be_hidden()
    assert errors == []
