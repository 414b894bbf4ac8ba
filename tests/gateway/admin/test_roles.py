"""Admin roles against a real gateway process: a viewer cannot write, an account admin cannot see or change
another account nor raise its own sub-accounts above the account, and every change lands in the audit log."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gateway.admin.access import RULES, rule_for
from quota.admin.keys import Role
from tests.gateway.admin_clients import ADMIN_KEY, AdminGateway, admin_routes, filled

READS = ("GET",)


@dataclass
class Tenant:
    account: str
    sub: str
    key: str
    secret: str


@dataclass
class Platform:
    gateway: AdminGateway
    acme: Tenant
    globex: Tenant
    viewer: str
    acme_admin: str
    acme_admin_id: str
    routes: list[tuple[str, str]]


def tenant(gateway: AdminGateway, name: str, quota: dict[str, int]) -> Tenant:
    account = gateway.call("POST", "/admin/accounts", {"name": name, "quota": quota}, expect=201)["id"]
    sub = gateway.call("POST", f"/admin/accounts/{account}/sub-accounts", {"name": "team"}, expect=201)["id"]
    key = gateway.call("POST", "/admin/keys", {"sub_account_id": sub, "name": "ci"}, expect=201)
    return Tenant(account, sub, key["id"], key["key"])


@pytest.fixture(scope="module")
def platform(admin_gateway: AdminGateway, tmp_path_factory: pytest.TempPathFactory) -> Platform:
    acme = tenant(admin_gateway, "acme", {"rpm": 100, "tpm": 10_000})
    globex = tenant(admin_gateway, "globex", {"rpm": 50})
    _, viewer = admin_gateway.admin_key("viewer")
    acme_admin_id, acme_admin = admin_gateway.admin_key("account_admin", acme.account)
    return Platform(admin_gateway, acme, globex, viewer, acme_admin, acme_admin_id,
                    admin_routes(tmp_path_factory.mktemp("routes")))


def other_tenant_ids(path: str, other: Tenant, kind: str = "accounts") -> dict[str, str]:
    """Path values naming the other tenant's record that the route's collection holds."""
    collection = path.split("/")[2] if not path.startswith("/admin/{kind") else kind
    record = {"accounts": other.account, "sub-accounts": other.sub, "keys": other.key}.get(collection, "x")
    return {"id": record, "kind": kind, "name": record, "model": record}


def test_a_viewer_reads_but_every_write_route_is_refused_with_403(platform: Platform) -> None:
    gateway, acme = platform.gateway, platform.acme
    viewer = gateway.client(platform.viewer)
    assert viewer.get("/admin/accounts").status_code == 200
    assert viewer.get("/admin/keys", params={"account_id": acme.account}).status_code == 200
    writes = [(m, p) for m, p in platform.routes if m not in READS]
    assert ("POST", "/admin/keys/{id}/rotate") in writes and ("POST", "/admin/admin-keys") in writes
    for method, path in writes:
        url = filled(path, {"id": acme.key, "kind": "keys", "name": "x", "model": "x"})
        response = viewer.request(method, url, json={"account_id": acme.account, "name": "x"})
        assert response.status_code == 403, (method, path, response.text)
        assert response.json()["error"]["code"] == "admin_role_forbidden"
    assert gateway.client(acme.secret).get("/v1/models").status_code == 200  # nothing was revoked or rotated
    assert viewer.get("/admin/admin-keys").status_code == 403  # admin identities are for owners


def test_an_account_admin_gets_404_or_403_for_every_route_with_another_accounts_ids(platform: Platform) -> None:
    gateway, globex = platform.gateway, platform.globex
    owner_view_before = gateway.call("GET", "/admin/keys", admin_key=ADMIN_KEY)
    tenant_admin = gateway.client(platform.acme_admin)
    tried = 0
    for method, path in platform.routes:
        for kind in (("accounts", "sub-accounts", "keys") if "{kind" in path else ("accounts",)):
            url = filled(path, other_tenant_ids(path, globex, kind))
            for named in ({"account_id": globex.account}, {"sub_account_id": globex.sub}, {"key_id": globex.key}):
                body = {**named, "name": "x", "quota": {"rpm": 1}} if method not in READS else None
                response = tenant_admin.request(method, url, params=named, json=body)
                tried += 1
                if response.status_code == 200:  # a read of its own data: nothing of globex's may show
                    assert all(i not in response.text for i in (globex.account, globex.sub, globex.key)), url
                    continue
                expected = 404 if Role.account_admin in rule_for(method, path).roles else 403
                assert response.status_code == expected, (method, url, named, response.text)
                assert "error" in response.json()
    assert tried >= 3 * len(platform.routes)
    assert gateway.call("GET", "/admin/keys", admin_key=ADMIN_KEY) == owner_view_before
    assert gateway.client(globex.secret).get("/v1/models").status_code == 200


def test_an_account_admin_manages_its_own_account_within_the_accounts_limits(platform: Platform) -> None:
    gateway, acme = platform.gateway, platform.acme
    tenant_admin = gateway.client(platform.acme_admin)
    accounts = tenant_admin.get("/admin/accounts").json()["data"]
    assert [a["id"] for a in accounts] == [acme.account]
    keys = tenant_admin.get("/admin/keys").json()["data"]
    assert {k["account_id"] for k in keys} == {acme.account}

    too_high = tenant_admin.patch(f"/admin/sub-accounts/{acme.sub}", json={"quota": {"rpm": 500}})
    assert too_high.status_code == 400, too_high.text
    error = too_high.json()["error"]
    assert error["param"] == "quota.rpm" and "rpm 100" in error["message"]
    refused = tenant_admin.post(f"/admin/accounts/{acme.account}/sub-accounts",
                                json={"name": "big", "quota": {"tpm": 20_000}})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "quota.tpm"
    assert tenant_admin.patch(f"/admin/sub-accounts/{acme.sub}", json={"quota": {"rpm": 80}}).status_code == 200
    created = tenant_admin.post("/admin/keys", json={"sub_account_id": acme.sub, "quota": {"rpm": 10}})
    assert created.status_code == 201 and created.json()["key"].startswith("tg-")
    own_account = tenant_admin.patch(f"/admin/accounts/{acme.account}", json={"quota": {"rpm": 10_000}})
    assert own_account.status_code == 403  # raising its own account's limits is the operator's call
    assert tenant_admin.get("/admin/me").json() == {"id": platform.acme_admin_id, "role": "account_admin",
                                                    "account_id": acme.account}


def test_every_change_of_a_scripted_sequence_is_in_the_audit_log_without_secrets(platform: Platform) -> None:
    gateway = platform.gateway
    operator_id, operator = gateway.admin_key("operator")
    account = gateway.call("POST", "/admin/accounts", {"name": "audited"}, operator, expect=201)
    key = gateway.call("POST", "/admin/keys", {"account_id": account["id"], "quota": {"rpm": 5}}, operator,
                       expect=201)
    gateway.call("PATCH", f"/admin/keys/{key['id']}", {"quota": {"rpm": 9}}, operator)
    rotated = gateway.call("POST", f"/admin/keys/{key['id']}/rotate", {"grace_seconds": 0}, operator)
    gateway.call("DELETE", f"/admin/keys/{key['id']}", admin_key=operator)
    gateway.call("DELETE", f"/admin/admin-keys/{operator_id}")

    entries = gateway.call("GET", "/admin/audit?limit=50", admin_key=platform.viewer)["data"]
    mine = [e for e in entries if e["actor"] == operator_id or e["target"] == operator_id]
    actions = [e["action"] for e in reversed(mine)]
    assert actions == ["admin-keys.create", "accounts.create", "keys.create", "keys.update", "keys.rotate", "keys.revoke",
                       "admin-keys.revoke"]
    by_action = {e["action"]: e for e in mine}
    assert by_action["keys.update"]["before"]["quota"] == {"rpm": 5}
    assert by_action["keys.update"]["after"]["quota"] == {"rpm": 9}
    assert by_action["keys.revoke"]["before"]["revoked_at"] is None
    assert by_action["keys.revoke"]["after"]["revoked_at"] is not None
    assert by_action["accounts.create"]["before"] is None and by_action["accounts.create"]["target"] == account["id"]
    assert by_action["keys.create"]["target"] == key["id"]
    for entry in mine:
        assert set(entry) == {"time", "actor", "role", "action", "target", "before", "after", "request_id",
                              "client"}
        assert entry["client"] == "127.0.0.1" and entry["request_id"]
    assert {e["role"] for e in mine} == {"operator", "owner"}
    text = json.dumps(entries)
    for secret in (key["key"], rotated["key"], operator, ADMIN_KEY, platform.viewer, platform.acme_admin):
        assert secret not in text

    filtered = gateway.client(platform.viewer).get("/admin/audit", params={"actor": operator_id,
                                                                           "action": "keys.update"})
    assert [e["target"] for e in filtered.json()["data"]] == [key["id"]]
    for method in ("POST", "PUT", "PATCH", "DELETE"):  # the log is read-only through the API
        assert gateway.client().request(method, "/admin/audit").status_code == 405


def test_the_admin_cli_creates_lists_and_revokes_admin_keys_rotates_keys_and_reads_the_audit(
        platform: Platform) -> None:
    gateway = platform.gateway

    def cli(*argv: str) -> Any:
        command = [sys.executable, "-m", "tidegate.cli", "admin", "--url", gateway.url, "--admin-key", ADMIN_KEY,
                   *argv]
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr + done.stdout
        return json.loads(done.stdout)

    created = cli("admin-keys", "create", "--role", "account_admin", "--account-id", platform.acme.account)
    assert created["key"].startswith("tga-") and created["role"] == "account_admin"
    assert created["id"] in [k["id"] for k in cli("admin-keys", "list")["data"]]
    assert cli("admin-keys", "revoke", created["id"])["revoked_at"]
    assert gateway.client(created["key"]).get("/admin/me").status_code == 401
    rotated = cli("keys", "rotate", platform.acme.key, "--grace-seconds", "60")
    assert rotated["key"] != platform.acme.secret
    assert gateway.client(platform.acme.secret).get("/v1/models").status_code == 200  # in its grace period
    assert cli("audit", "--action", "admin-keys.revoke", "--limit", "1")["data"][0]["target"] == created["id"]


def test_the_route_table_in_the_docs_matches_the_one_the_gateway_enforces() -> None:
    doc = (Path(__file__).parents[3] / "docs" / "admin.md").read_text()
    rows = {line.split("|")[1].strip(" `"): [c.strip() for c in line.split("|")[2:6]]
            for line in doc.splitlines() if line.startswith("| `") and "/admin" in line}
    for (method, path), rule in RULES.items():
        shown = f"{method} {path.replace('{kind:str}', '{accounts,sub-accounts,keys}').replace(':path}', '}')}"
        assert shown in rows, shown
        assert [bool(cell) for cell in rows[shown]] == [role in rule.roles for role in Role], shown
