"""The admin console in headless Chromium against a real gateway and backend on loopback.

An operator signs in, creates a sub-account and a key, sees the key's usage after requests made with it,
revokes it and sees the next request refused; a wrong admin key is refused; an account admin sees only its own
tenant; an operator sets a price and reads spend per sub-account and unit cost per model beside it. One screenshot
per step.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path

import httpx
import openai
import pytest
from playwright.sync_api import Browser, Page, expect, sync_playwright

from tests.backend.backend_process import BackendProcess
from tests.gateway.live_stack import ADMIN_KEY, LiveStack, live_stack

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]

pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="needs Debian's chromium")


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, model_path: Path,
          shared_backend: BackendProcess) -> Iterator[LiveStack]:
    with live_stack(tmp_path_factory.mktemp("console-stack"), model_path, channel={"cost_per_hour": 2.4},
                    backend=shared_backend) as running:
        yield running


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser: Browser) -> Iterator[Page]:
    context = browser.new_context(viewport={"width": 1200, "height": 1600})
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    # what the Content-Security-Policy refused (an inline style or script the console needed) shows as a console
    # error; API errors the tests provoke show as failed loads, not these
    page.on("console", lambda message: errors.append(message.text)
            if message.type == "error" and "Content Security Policy" in message.text else None)
    yield page
    context.close()
    assert errors == [], f"the console's script failed: {errors}"


class Steps:
    """Screenshots named in order, one per step, into the test's temp dir."""

    def __init__(self, page: Page, folder: Path) -> None:
        self.page, self.folder, self.count = page, folder, 0

    def shot(self, name: str) -> Path:
        self.count += 1
        path = self.folder / f"{self.count:02d}-{name}.png"
        self.page.screenshot(path=str(path), full_page=True)
        return path


def sign_in(page: Page, url: str, admin_key: str) -> None:
    page.goto(f"{url}/admin/ui")
    page.fill("#admin-key", admin_key)
    page.click("#signin button[type=submit]")


def chat(stack: LiveStack, secret: str) -> openai.types.chat.ChatCompletion:
    return stack.client(secret).chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Hi"}], max_tokens=3)


def test_operator_creates_a_key_sees_its_usage_and_revokes_it(stack: LiveStack, page: Page, tmp_path: Path) -> None:
    steps = Steps(page, tmp_path)
    sign_in(page, stack.url, ADMIN_KEY)
    expect(page.locator("#app")).to_be_visible()
    assert page.evaluate("sessionStorage.getItem('tidegate.adminKey')") == ADMIN_KEY
    steps.shot("signed-in")

    page.fill("#create-account input[name=name]", "acme")
    page.click("#create-account button[type=submit]")
    account_row = page.locator("#accounts-table tbody tr", has_text="acme")
    expect(account_row).to_have_count(1)
    account_row.locator("button.open-account").click()
    expect(page.locator("#account-detail")).to_be_visible()
    steps.shot("account-created")

    page.fill("#create-sub-account input[name=name]", "research")
    page.click("#create-sub-account button[type=submit]")
    expect(page.locator("#sub-accounts-table tbody tr", has_text="research")).to_have_count(1)
    steps.shot("sub-account-created")

    page.fill("#create-key input[name=name]", "notebook")
    page.select_option("#create-key select[name=sub_account_id]", label="research")
    page.click("#create-key button[type=submit]")
    expect(page.locator("#new-secret")).to_be_visible()
    secret = page.inner_text("#new-secret-value").strip()
    assert secret.startswith("tg-")
    key_row = page.locator("#keys-table tbody tr", has_text="notebook")
    expect(key_row.locator("td.state")).to_have_text("active")
    expect(key_row).to_contain_text("research")
    steps.shot("key-created")
    page.click("#dismiss-secret")
    expect(page.locator("#new-secret")).to_be_hidden()
    assert secret not in page.content()  # shown once, then gone from the page

    key_row.locator("button.edit-quota").click()
    page.fill("#quota-form input[name=rpm]", "100")
    page.fill("#quota-form input[name=tpm]", "50000")
    page.fill("#quota-form input[name=request_bucket_rate]", "5")
    page.fill("#quota-form input[name=request_bucket_burst]", "20")
    page.click("#quota-save")
    expect(key_row.locator("td").nth(4)).to_have_text("rpm 100 · tpm 50000 · request_bucket 5/s burst 20")
    steps.shot("quota-set")

    completions = [chat(stack, secret) for _ in range(3)]
    prompt = sum(c.usage.prompt_tokens for c in completions if c.usage)
    completion = sum(c.usage.completion_tokens for c in completions if c.usage)

    page.select_option("#usage-filter select[name=group]", "key")
    page.click("#usage-filter button[type=submit]")
    usage_row = page.locator("#usage-table tbody tr[data-series=notebook]")
    expect(usage_row.locator("td").nth(1)).to_have_text("3")
    expect(usage_row.locator("td").nth(2)).to_have_text(f"{prompt:,}")
    expect(usage_row.locator("td").nth(3)).to_have_text(f"{completion:,}")
    expect(page.locator("#usage-chart polyline[data-series=notebook]")).to_have_count(1)
    steps.shot("usage-shown")

    # Live load over the trailing minute, against each level's quota (polled every 5 s).
    live = page.locator("#live-table tbody")
    account_id, key_id = account_row.get_attribute("data-id"), key_row.get_attribute("data-id")
    expect(live.locator(f"tr[data-id='{account_id}'] td.rpm")).to_have_text("3 (unlimited)", timeout=15_000)
    expect(live.locator(f"tr[data-id='{key_id}'] td.rpm")).to_have_text("3 / 100", timeout=15_000)
    expect(live.locator(f"tr[data-id='{key_id}'] td.tpm")).to_have_text(f"{prompt + completion:,} / 50,000")
    channel = page.locator("#channels-table tbody tr[data-channel=local-1][data-model=smollm2]")
    expect(channel.locator("td.breaker")).to_have_text("closed")
    expect(channel.locator("td.health")).to_have_text("ok")
    steps.shot("live-and-channels")

    key_row.locator("button.revoke").click()
    key_row.locator("button.revoke").click()  # the second click confirms
    expect(key_row.locator("td.state")).to_have_text("revoked")
    steps.shot("key-revoked")
    with pytest.raises((openai.PermissionDeniedError, openai.AuthenticationError)):
        chat(stack, secret)
    assert len(list(tmp_path.glob("*.png"))) == steps.count


def test_wrong_admin_key_is_refused_on_the_page(stack: LiveStack, page: Page, tmp_path: Path) -> None:
    steps = Steps(page, tmp_path)
    sign_in(page, stack.url, "not-the-admin-key")
    expect(page.locator("#signin-error")).to_be_visible()
    expect(page.locator("#signin-error")).to_contain_text("Admin key refused")
    expect(page.locator("#app")).to_be_hidden()
    assert page.evaluate("sessionStorage.getItem('tidegate.adminKey')") is None
    steps.shot("refused")


def test_api_errors_show_on_the_page_and_names_render_as_text(stack: LiveStack, page: Page, tmp_path: Path) -> None:
    steps = Steps(page, tmp_path)
    sign_in(page, stack.url, ADMIN_KEY)
    expect(page.locator("#app")).to_be_visible()

    page.fill("#create-account input[name=name]", "x" * 201)
    page.click("#create-account button[type=submit]")
    expect(page.locator("#app-error")).to_be_visible()
    expect(page.locator("#app-error")).to_contain_text("name")
    steps.shot("refused-name")

    hostile = '<img src=x onerror="document.body.dataset.owned=1">'
    page.fill("#create-account input[name=name]", hostile)
    page.click("#create-account button[type=submit]")
    row = page.locator("#accounts-table tbody tr", has_text=hostile)
    expect(row).to_have_count(1)
    expect(page.locator("#app-error")).to_be_hidden()
    assert row.locator("img").count() == 0
    assert page.evaluate("document.body.dataset.owned") is None
    steps.shot("name-as-text")


def test_an_account_admin_signed_in_sees_and_manages_only_its_own_tenant(stack: LiveStack, page: Page,
                                                                          tmp_path: Path) -> None:
    steps = Steps(page, tmp_path)
    with httpx.Client(base_url=stack.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as owner:
        ours = owner.post("/admin/accounts", json={"name": "tenant-own", "quota": {"rpm": 100}}).json()["id"]
        theirs = owner.post("/admin/accounts", json={"name": "tenant-other"}).json()["id"]
        owner.post(f"/admin/accounts/{theirs}/sub-accounts", json={"name": "their-team"})
        their_key = owner.post("/admin/keys", json={"account_id": theirs, "name": "their-key"}).json()["id"]
        tenant = owner.post("/admin/admin-keys", json={"role": "account_admin", "account_id": ours}).json()
    tenant_key, tenant_id = tenant["key"], tenant["id"]

    sign_in(page, stack.url, tenant_key)
    expect(page.locator("#app")).to_be_visible()
    expect(page.locator("#whoami")).to_have_text("account_admin of tenant-own")
    rows = page.locator("#accounts-table tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_have_attribute("data-id", ours)
    expect(page.locator("#account-detail")).to_be_visible()  # its one account opens by itself
    expect(page.locator("#account-name")).to_have_text("tenant-own")
    expect(page.locator("#create-account")).to_be_hidden()
    expect(page.locator("#channels")).to_be_hidden()
    expect(page.locator("#audit")).to_be_hidden()
    expect(page.locator("#usage h2")).to_have_text("Usage of tenant-own")
    steps.shot("tenant-signed-in")

    page.fill("#create-sub-account input[name=name]", "own-team")
    page.click("#create-sub-account button[type=submit]")
    expect(page.locator("#sub-accounts-table tbody tr", has_text="own-team")).to_have_count(1)
    page.fill("#create-key input[name=name]", "own-key")
    page.click("#create-key button[type=submit]")
    expect(page.locator("#new-secret")).to_be_visible()
    expect(page.locator("#keys-table tbody tr", has_text="own-key")).to_have_count(1)
    expect(page.locator("#app-error")).to_be_hidden()
    steps.shot("tenant-key-created")
    content = page.content()
    for foreign in (theirs, "tenant-other", "their-team", their_key, "acme"):
        assert foreign not in content

    # the owner sees the tenant's changes in the audit log
    page.click("#sign-out")
    sign_in(page, stack.url, ADMIN_KEY)
    by_tenant = page.locator(f"#audit-table tbody tr[data-actor='{tenant_id}']")
    expect(by_tenant).to_have_count(2)
    expect(by_tenant.nth(0)).to_have_attribute("data-action", "keys.create")
    expect(by_tenant.nth(1)).to_have_attribute("data-action", "sub-accounts.create")
    assert tenant_key not in page.content()
    steps.shot("owner-sees-the-audit")
def test_operator_adds_a_channel_then_drains_and_removes_it(stack: LiveStack, page: Page, tmp_path: Path) -> None:
    steps = Steps(page, tmp_path)
    sign_in(page, stack.url, ADMIN_KEY)
    page.fill("#add-channel input[name=name]", "spare")
    page.fill("#add-channel input[name=base_url]", "http://127.0.0.1:9/v1")
    page.fill("#add-channel input[name=models]", "spare-model=smollm2")
    page.click("#add-channel button[type=submit]")
    row = page.locator("#channels-table tbody tr[data-channel=spare][data-model=spare-model]")
    expect(row).to_have_count(1)
    steps.shot("channel-added")
    row.locator("button.remove").click()
    expect(row).to_have_count(0, timeout=15_000)  # drained (nothing in flight) and removed
    expect(page.locator("#channels-table tbody tr[data-channel=local-1]")).to_have_count(1)
    steps.shot("channel-removed")


def test_operator_sets_a_price_and_sees_spend_per_sub_account_and_unit_cost_per_model(
        stack: LiveStack, page: Page, tmp_path: Path) -> None:
    steps = Steps(page, tmp_path)
    with httpx.Client(base_url=stack.url, headers={"authorization": f"Bearer {ADMIN_KEY}"}) as owner:
        account = owner.post("/admin/accounts", json={"name": "finance-co"}).json()["id"]
        secrets = {}
        for team in ("retail", "wholesale"):
            sub = owner.post(f"/admin/accounts/{account}/sub-accounts", json={"name": team}).json()["id"]
            secrets[team] = owner.post("/admin/keys", json={"sub_account_id": sub}).json()["key"]
        viewer = owner.post("/admin/admin-keys", json={"role": "viewer"}).json()["key"]

        sign_in(page, stack.url, ADMIN_KEY)
        page.fill("#set-price input[name=model]", "smollm2")
        page.fill("#set-price input[name=input]", "1")
        page.fill("#set-price input[name=output]", "2")
        page.click("#set-price button[type=submit]")
        expect(page.locator("#prices-table tbody tr[data-model=smollm2] td.output").first).to_have_text("2")
        newest = owner.get("/admin/prices").json()["data"][-1]
        assert (newest["model"], newest["input"], newest["cached_input"], newest["output"]) == ("smollm2", 1, 1, 2)
        steps.shot("price-set")
        refused = owner.get("/admin/usage/unit-cost", params={"by": "team"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "by"

    # Spend is priced at admission, so only traffic after the price costs; each request is prompt x 1 + completion x 2.
    spend = {team: sum(Decimal(c.usage.prompt_tokens + 2 * c.usage.completion_tokens) / 10**6
                       for c in [chat(stack, secrets[team]) for _ in range(runs)] if c.usage)
             for team, runs in (("retail", 2), ("wholesale", 1))}
    page.locator("#accounts-table tbody tr", has_text="finance-co").locator("button.open-account").click()
    page.select_option("#usage-filter select[name=group]", "sub_account")
    page.select_option("#usage-filter select[name=measure]", "cost")
    page.click("#usage-filter button[type=submit]")
    for team, cost in spend.items():
        expect(page.locator(f"#usage-table tbody tr[data-series={team}] td.cost")).to_have_text(f"{cost:f}")
        expect(page.locator(f"#usage-chart polyline[data-series={team}]")).to_have_count(1)
    expect(page.locator("#usage-total td").nth(1)).to_have_text("3")
    expect(page.locator("#usage-total td.cost")).to_have_text(f"{sum(spend.values()):f}")
    steps.shot("spend-per-sub-account")

    page.click("#unit-cost-filter button[type=submit]")
    today = page.locator("#unit-cost-table tbody tr[data-model=smollm2]").last
    expect(today.locator("td.vendor-output")).to_have_text("2")
    expect(today.locator("td.vendor-input")).to_have_text("1")
    cells = [float(t.replace(",", "")) for t in today.locator("td").all_inner_texts()[2:5]]
    tokens, running, own = cells
    assert tokens > 0 and running > 0 and own == pytest.approx(running * 1e6 / tokens, rel=1e-3)
    steps.shot("unit-cost-per-model")

    page.click("#sign-out")
    sign_in(page, stack.url, viewer)
    expect(page.locator("#prices-table tbody tr[data-model=smollm2]").first).to_be_visible()
    expect(page.locator("#unit-cost")).to_be_visible()
    expect(page.locator("#set-price")).to_be_hidden()  # a viewer may read prices, not set them
    for write in ("#create-account", "#add-channel", "#accounts-table .edit-quota", "#channels-table .remove"):
        expect(page.locator(write).first).to_be_hidden()  # nor change anything else
    steps.shot("viewer-reads-prices")
