"""`tidegate admin prices|balance|unit-cost`: the money commands, as requests to the admin API."""

from __future__ import annotations

import argparse
from typing import Any

MONEY_RESOURCES = ("prices", "balance", "unit-cost")


def add_money_arguments(sub: Any) -> None:
    prices = sub.add_parser("prices", help="prices per million tokens").add_subparsers(dest="action", required=True)
    prices.add_parser("list")
    price = prices.add_parser("set", help="a new price from --effective-from (default now)")
    price.add_argument("model")
    for name in ("--input", "--output"):
        price.add_argument(name, required=True, help="currency units per million tokens")
    price.add_argument("--cached-input", help="default: the input price")
    price.add_argument("--channel", help="a channel whose price differs from the model's")
    price.add_argument("--effective-from", help="ISO 8601 time with its UTC offset")

    balance = sub.add_parser("balance", help="prepaid balances").add_subparsers(dest="action", required=True)
    balance.add_parser("show").add_argument("account_id")
    top_up = balance.add_parser("top-up", help="adds --amount (negative for an adjustment) to the journal")
    top_up.add_argument("account_id")
    top_up.add_argument("--amount", required=True)
    top_up.add_argument("--note", default="")

    unit = sub.add_parser("unit-cost", help="cost per million tokens of own channels, per day")
    unit.add_argument("--start")
    unit.add_argument("--end")
    unit.add_argument("--by", choices=["channel", "model"], help="per own channel (default) or per model served")


def money_request(args: argparse.Namespace) -> tuple[str, str, dict[str, Any] | None, dict[str, str]]:
    if args.resource == "unit-cost":
        return "GET", "/admin/usage/unit-cost", None, {n: getattr(args, n) for n in ("start", "end", "by")
                                                       if getattr(args, n)}
    if args.resource == "prices":
        if args.action == "list":
            return "GET", "/admin/prices", None, {}
        body = {name: getattr(args, name) for name in ("input", "cached_input", "output", "channel", "effective_from")
                if getattr(args, name) is not None}
        return "PUT", f"/admin/prices/{args.model}", body, {}
    path = f"/admin/accounts/{args.account_id}/balance"
    if args.action == "show":
        return "GET", path, None, {}
    return "POST", path, {"amount": args.amount, "note": args.note}, {}
