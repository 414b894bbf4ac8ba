"""API key hygiene against a real gateway process: rotation with a grace period, IP allowlists, the prefix
shown in lists and last_used_at."""

from __future__ import annotations

import time
from typing import Any

import httpx
import openai
import pytest

from tests.gateway.admin_clients import AdminGateway
from tests.waiting import wait_until

OTHER_ADDRESS = "127.0.0.2"  # loopback too, but not the 127.0.0.1 the allowlists below name


def works(gateway: AdminGateway, secret: str, local_address: str | None = None) -> bool:
    """Whether the key authenticates: /v1/models checks the key and needs no upstream."""
    status = gateway.client(secret, local_address).get("/v1/models").status_code
    assert status in (200, 401), status
    return status == 200


def new_key(gateway: AdminGateway, **fields: object) -> dict[str, Any]:
    account = gateway.call("POST", "/admin/accounts", {"name": "hygiene"}, expect=201)["id"]
    created: dict[str, Any] = gateway.call("POST", "/admin/keys", {"account_id": account, **fields}, expect=201)
    return created


def test_a_rotated_key_takes_both_secrets_during_the_grace_period_and_only_the_new_one_after(
        admin_gateway: AdminGateway) -> None:
    key = new_key(admin_gateway)
    asked_at = time.monotonic()  # the grace starts after this, while the gateway rotates
    rotated = admin_gateway.call("POST", f"/admin/keys/{key['id']}/rotate", {"grace_seconds": 5})
    assert rotated["id"] == key["id"] and rotated["key"] != key["key"] and rotated["key"].startswith("tg-")
    assert rotated["prefix"] == rotated["key"][:8]
    assert works(admin_gateway, key["key"]) and works(admin_gateway, rotated["key"])
    wait_until(lambda: not works(admin_gateway, key["key"]), timeout=30, what="the old secret's grace to end")
    assert time.monotonic() - asked_at > 4.5  # not before the grace ended
    assert works(admin_gateway, rotated["key"])

    refused = admin_gateway.client().post(f"/admin/keys/{key['id']}/rotate", json={"grace_seconds": -1})
    assert refused.status_code == 400 and "grace_seconds" in refused.json()["error"]["message"]
    admin_gateway.call("DELETE", f"/admin/keys/{key['id']}")
    revoked = admin_gateway.client().post(f"/admin/keys/{key['id']}/rotate", json={})
    assert revoked.status_code == 400


def test_a_second_rotation_without_grace_leaves_no_earlier_secret_working(admin_gateway: AdminGateway) -> None:
    key = new_key(admin_gateway)
    first = admin_gateway.call("POST", f"/admin/keys/{key['id']}/rotate", {"grace_seconds": 3600})
    assert works(admin_gateway, key["key"])
    second = admin_gateway.call("POST", f"/admin/keys/{key['id']}/rotate", {"grace_seconds": 0})
    assert not works(admin_gateway, key["key"]) and not works(admin_gateway, first["key"])
    assert works(admin_gateway, second["key"])


def test_an_allowlisted_key_is_refused_from_another_address_with_403_ip_not_allowed(
        admin_gateway: AdminGateway) -> None:
    key = new_key(admin_gateway, allowed_ips=["127.0.0.1", "10.0.0.0/8"])
    assert key["allowed_ips"] == ["127.0.0.1/32", "10.0.0.0/8"]
    assert works(admin_gateway, key["key"])
    outside = openai.OpenAI(base_url=f"{admin_gateway.url}/v1", api_key=key["key"], max_retries=0,
                            http_client=httpx.Client(transport=httpx.HTTPTransport(local_address=OTHER_ADDRESS)))
    with outside, pytest.raises(openai.PermissionDeniedError) as refused:
        outside.models.list()
    assert refused.value.code == "ip_not_allowed"
    # a forwarding header from a peer that is not a trusted proxy changes nothing
    spoofed = admin_gateway.client(key["key"], OTHER_ADDRESS).get("/v1/models",
                                                                  headers={"x-forwarded-for": "127.0.0.1"})
    assert spoofed.status_code == 403

    admin_gateway.call("PATCH", f"/admin/keys/{key['id']}", {"allowed_ips": ["10.0.0.0/8"]})
    assert admin_gateway.client(key["key"]).get("/v1/models").status_code == 403
    admin_gateway.call("PATCH", f"/admin/keys/{key['id']}", {"allowed_ips": None})
    assert works(admin_gateway, key["key"], OTHER_ADDRESS)
    bad = admin_gateway.client().patch(f"/admin/keys/{key['id']}", json={"allowed_ips": ["10.0.0.0/33"]})
    assert bad.status_code == 400 and "allowed_ips" in bad.json()["error"]["message"]


def test_keys_list_their_prefix_and_when_they_were_last_used(admin_gateway: AdminGateway) -> None:
    key = new_key(admin_gateway)
    listed = admin_gateway.call("GET", f"/admin/keys?account_id={key['account_id']}")["data"]
    assert listed[0]["prefix"] == key["key"][:8] and listed[0]["last_used_at"] is None
    assert key["key"] not in str(listed)
    assert works(admin_gateway, key["key"])

    def last_used() -> str | None:
        used: str | None = admin_gateway.call("GET", f"/admin/keys?account_id={key['account_id']}")["data"][0][
            "last_used_at"]
        return used

    first = wait_until(last_used, timeout=30, what="last_used_at to be recorded")
    assert works(admin_gateway, key["key"])
    assert last_used() == first  # at most one write a minute per key, not one per request
