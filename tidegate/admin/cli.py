"""`tidegate admin`: accounts, sub-accounts, keys, quotas, usage, channels and model groups, prices and balances,
admin keys and the audit log over the admin API."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import httpx

from config.admin_key import configured_admin_key
from config.url_credentials import redact_url
from tidegate.admin.channels import RESOURCES as ROUTING_RESOURCES
from tidegate.admin.channels import add_routing_arguments, routing_request
from tidegate.admin.money import MONEY_RESOURCES, add_money_arguments, money_request

QUOTA_FLAGS = ("rpm", "tpm", "max_concurrency", "tokens_per_day", "tokens_per_month")
BUCKET_FLAGS = ("request_bucket", "token_bucket")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", default=os.environ.get("TIDEGATE_URL", "http://127.0.0.1:8000"),
                        help="the gateway's root URL (env TIDEGATE_URL)")
    parser.add_argument("--admin-key", default=os.environ.get("TIDEGATE_ADMIN_KEY"),
                        help="the admin key (env TIDEGATE_ADMIN_KEY; else the config's admin_key)")
    sub = parser.add_subparsers(dest="resource", metavar="RESOURCE", required=True)

    accounts = sub.add_parser("accounts").add_subparsers(dest="action", required=True)
    _account_flags(_quota_flags(_named(accounts.add_parser("create"), "name")))
    accounts.add_parser("list")
    _account_flags(_quota_flags(_named(accounts.add_parser("update"), "id", "--name")))

    subs = sub.add_parser("sub-accounts").add_subparsers(dest="action", required=True)
    _quota_flags(_named(subs.add_parser("create"), "account_id", "name"))
    _named(subs.add_parser("list"), "account_id")
    _quota_flags(_named(subs.add_parser("update"), "id", "--name"))

    keys = sub.add_parser("keys").add_subparsers(dest="action", required=True)
    create = _quota_flags(keys.add_parser("create", help="prints the secret once"))
    owner = create.add_mutually_exclusive_group(required=True)
    owner.add_argument("--account-id")
    owner.add_argument("--sub-account-id")
    _key_fields(create)
    listing = keys.add_parser("list")
    listing.add_argument("--account-id")
    listing.add_argument("--sub-account-id")
    _key_fields(_quota_flags(_named(keys.add_parser("update"), "id")))
    _named(keys.add_parser("revoke"), "id")
    rotate = _named(keys.add_parser("rotate", help="prints the new secret once"), "id")
    rotate.add_argument("--grace-seconds", type=float, default=0.0, help="how long the old secret keeps working")

    admin_keys = sub.add_parser("admin-keys", help="admin identities (owners only)").add_subparsers(
        dest="action", required=True)
    create_admin = admin_keys.add_parser("create", help="prints the secret once")
    create_admin.add_argument("--role", required=True, choices=["owner", "operator", "viewer", "account_admin"])
    create_admin.add_argument("--account-id", help="the account an account_admin manages")
    create_admin.add_argument("--name")
    admin_keys.add_parser("list")
    _named(admin_keys.add_parser("revoke"), "id")

    audit = sub.add_parser("audit", help="the admin changes, newest first")
    for name in ("--actor", "--action", "--since", "--limit"):
        audit.add_argument(name)

    usage = sub.add_parser("usage", help="tokens and requests, filtered")
    for name in ("--account-id", "--sub-account-id", "--key-id", "--model", "--start", "--end"):
        usage.add_argument(name)
    usage.add_argument("--granularity", choices=["hour", "day", "month"])
    usage.add_argument("--group-by", help="comma-separated: account, sub_account, key, model, channel")
    usage.add_argument("--format", choices=["json", "csv"])
    add_money_arguments(sub)
    add_routing_arguments(sub)


def _named(parser: argparse.ArgumentParser, *names: str) -> argparse.ArgumentParser:
    for name in names:
        parser.add_argument(name)
    return parser


def _quota_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    for name in QUOTA_FLAGS:
        parser.add_argument("--" + name.replace("_", "-"), type=int, dest=name)
    for name in BUCKET_FLAGS:
        parser.add_argument("--" + name.replace("_", "-"), type=_bucket, dest=name, metavar="RATE:BURST",
                            help="a token bucket: RATE per second, BURST at once")
    parser.add_argument("--budget-amount", help="spend limit in currency units (with --budget-window)")
    parser.add_argument("--budget-window", default="month", help="day, week, month, rolling_days:N or total")
    return parser


def _account_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("--timezone", help="IANA name; where the account's budget days, weeks and months begin")
    parser.add_argument("--price-multiplier", type=float, help="factor on every price (0.8: a 20%% discount)")
    parser.add_argument("--cache-scope", choices=["account", "key", "shared"],
                        help="who may share the upstream prefix cache: the account's keys (default), each key "
                             "alone, or every shared account")
    return parser


def _bucket(text: str) -> dict[str, float | int]:
    rate, sep, burst = text.partition(":")
    try:
        if sep:
            return {"rate": float(rate) if "." in rate else int(rate), "burst": int(burst)}
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(f"expected RATE:BURST, such as 2:10, not {text!r}")


def _key_fields(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--name")
    parser.add_argument("--models", help="comma-separated model names the key may use")
    parser.add_argument("--priority-class")
    parser.add_argument("--expires-at", help="ISO 8601 time")
    parser.add_argument("--allowed-ips", help="comma-separated addresses and CIDR blocks the key may be used from")


def request_for(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None, dict[str, str]]:
    """(method, path, JSON body, query) for the parsed command."""
    resource, action = args.resource, getattr(args, "action", None)
    quota: dict[str, Any] = {name: getattr(args, name) for name in (*QUOTA_FLAGS, *BUCKET_FLAGS)
                             if getattr(args, name, None) is not None}
    if getattr(args, "budget_amount", None) is not None:
        quota["budget"] = {"amount": args.budget_amount, "window": args.budget_window}
    fields = {name: getattr(args, name) for name in ("name", "priority_class", "expires_at", "timezone",
                                                     "price_multiplier", "cache_scope") if getattr(args, name, None) is not None}
    for name in ("models", "allowed_ips"):
        if getattr(args, name, None) is not None:
            fields[name] = [item.strip() for item in getattr(args, name).split(",") if item.strip()]
    if quota:
        fields["quota"] = quota
    if resource == "audit":
        return "GET", "/admin/audit", None, {n: getattr(args, n) for n in ("actor", "action", "since", "limit")
                                             if getattr(args, n)}
    if resource == "admin-keys":
        if action == "create":
            body = {"role": args.role, "account_id": args.account_id, "name": args.name or ""}
            return "POST", "/admin/admin-keys", body, {}
        if action == "revoke":
            return "DELETE", f"/admin/admin-keys/{args.id}", None, {}
        return "GET", "/admin/admin-keys", None, {}
    if action == "rotate":
        return "POST", f"/admin/keys/{args.id}/rotate", {"grace_seconds": args.grace_seconds}, {}
    if resource in MONEY_RESOURCES:
        return money_request(args)
    if resource in ROUTING_RESOURCES:
        return routing_request(args)
    if resource == "usage":
        names = ("account_id", "sub_account_id", "key_id", "model", "start", "end", "granularity", "group_by",
                 "format")
        return "GET", "/admin/usage", None, {n: getattr(args, n) for n in names if getattr(args, n)}
    if action == "list":
        if resource == "sub-accounts":
            return "GET", f"/admin/accounts/{args.account_id}/sub-accounts", None, {}
        query = {n: getattr(args, n) for n in ("account_id", "sub_account_id") if getattr(args, n, None)}
        return "GET", f"/admin/{resource}", None, query
    if action == "update":
        return "PATCH", f"/admin/{resource}/{args.id}", fields, {}
    if action == "revoke":
        return "DELETE", f"/admin/keys/{args.id}", None, {}
    if resource == "sub-accounts":
        return "POST", f"/admin/accounts/{args.account_id}/sub-accounts", fields, {}
    if resource == "keys":
        owner = {"sub_account_id": args.sub_account_id} if args.sub_account_id else {"account_id": args.account_id}
        return "POST", "/admin/keys", {**owner, **fields}, {}
    return "POST", "/admin/accounts", fields, {}


def main(args: argparse.Namespace) -> int:
    admin_key = args.admin_key or configured_admin_key(args.settings.gateway)
    if not admin_key:
        print("tidegate admin: no admin key (--admin-key, TIDEGATE_ADMIN_KEY, admin_key or admin_key_file)",
              file=sys.stderr)
        return 2
    method, path, body, query = request_for(args)
    try:
        response = httpx.request(method, args.url.rstrip("/") + path, json=body, params=query,
                                 headers={"authorization": f"Bearer {admin_key}"}, timeout=30)
    except httpx.HTTPError as exc:
        print(f"tidegate admin: cannot reach {redact_url(args.url)}: {exc}", file=sys.stderr)
        return 1
    try:
        shown: Any = response.json()
    except ValueError:
        shown = response.text
    print(json.dumps(shown, indent=2) if not isinstance(shown, str) else shown)
    return 0 if response.is_success else 1
