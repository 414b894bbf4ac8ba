"""The console's Batches page in headless Chromium: an operator opens an account and sees its batch, its state and
its lines done, as `GET /admin/batches` reports them."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from playwright.sync_api import expect, sync_playwright

from tests.backend.backend_process import BackendProcess
from tests.gateway.admin.test_console import CHROMIUM, CHROMIUM_ARGS, sign_in
from tests.gateway.batch.helpers import TERMINAL, chat_lines, jsonl
from tests.gateway.live_stack import ADMIN_KEY, LiveStack, live_stack
from tests.waiting import wait_until

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium")


@pytest.fixture
def stack(tmp_path: Path, model_path: Path, shared_backend: BackendProcess) -> Iterator[LiveStack]:
    with live_stack(tmp_path, model_path, backend=shared_backend) as running:
        yield running


def test_the_batches_page_shows_an_accounts_batch_and_its_lines(stack: LiveStack, tmp_path: Path) -> None:
    admin = httpx.Client(base_url=stack.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}, timeout=30)
    account = admin.post("/admin/accounts", json={"name": "nightly"}).json()
    secret = admin.post("/admin/keys", json={"account_id": account["id"]}).json()["key"]
    client = stack.client(secret)
    upload = client.files.create(file=("input.jsonl", jsonl(chat_lines(3, max_tokens=2))), purpose="batch")
    batch = client.batches.create(input_file_id=upload.id, endpoint="/v1/chat/completions", completion_window="24h")
    wait_until(lambda: client.batches.retrieve(batch.id).status in TERMINAL, timeout=120, what="the batch to end")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1200, "height": 1600})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        sign_in(page, stack.url, ADMIN_KEY)
        page.locator("#accounts-table tbody tr", has_text="nightly").locator("button.open-account").click()
        row = page.locator("#batches-table tbody tr", has_text=batch.id)
        expect(row).to_have_attribute("data-status", "completed")
        expect(row.locator("td").nth(4)).to_have_text("3 / 3")
        expect(page.locator("#batches-scope")).to_have_text("of nightly")
        page.screenshot(path=str(tmp_path / "batches.png"), full_page=True)
        browser.close()
    assert errors == []
