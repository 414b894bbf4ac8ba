"""`tidegate admin channels ...` and `tidegate admin model-groups ...`: run-time routing over the admin API."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

RESOURCES = ("channels", "model-groups")
Call = tuple[str, str, dict[str, Any] | None, dict[str, str]]


def add_routing_arguments(sub: Any) -> None:
    """Adds the two resources to `tidegate admin`'s subparsers."""
    channels = sub.add_parser("channels", help="list, add, update or remove (drain) upstream channels")
    actions = channels.add_subparsers(dest="action")  # no action: list
    actions.add_parser("list", help="health, breaker state and in-flight per channel and model")
    _channel_fields(actions.add_parser("add"), required=True)
    _channel_fields(actions.add_parser("update"), required=False)
    actions.add_parser("remove", help="no new requests at once; removed when those in flight are done"
                       ).add_argument("name")

    groups = sub.add_parser("model-groups", help="public model names over channel targets, with fallbacks")
    group_actions = groups.add_subparsers(dest="action")
    group_actions.add_parser("list")
    put = group_actions.add_parser("set", help="create or replace a group")
    put.add_argument("name")
    put.add_argument("--target", action="append", required=True, metavar="CHANNEL=MODEL",
                     help="a channel and the model name it knows (repeat, in order)")
    put.add_argument("--fallback", action="append", default=[], metavar="MODEL",
                     help="a public model tried when no target can take a request (repeat, in order)")
    group_actions.add_parser("remove").add_argument("name")


def _channel_fields(parser: argparse.ArgumentParser, required: bool) -> None:
    parser.add_argument("name")
    parser.add_argument("--base-url", required=required, help="the upstream's OpenAI root, e.g. http://h:9001/v1")
    parser.add_argument("--models", required=required, metavar="PUBLIC[=UPSTREAM],...",
                        help="public model names, each with the upstream's name for it when it differs")
    parser.add_argument("--kind", choices=("openai", "azure", "anthropic"), help="the upstream's wire format")
    parser.add_argument("--api-version", help="azure: the api-version query; anthropic: the anthropic-version header")
    parser.add_argument("--api-key-file", type=Path, help="a file holding the upstream's API key (kept out of ps)")
    parser.add_argument("--weight", type=float)
    parser.add_argument("--priority", type=int, help="tier: lower is tried first")
    parser.add_argument("--max-concurrency", type=int)
    parser.add_argument("--health-path", help="polled for health; 'none' for upstreams without one")
    parser.add_argument("--stream-upstream", action=argparse.BooleanOptionalAction, default=None,
                        help="stream upstream even for non-streamed clients (off for upstreams that cannot)")
    parser.add_argument("--embeddings", action=argparse.BooleanOptionalAction, default=None,
                        help="the upstream serves /embeddings: send it embedding requests")


def routing_request(args: argparse.Namespace) -> Call:
    """(method, path, JSON body, query) for a channels or model-groups command."""
    base = f"/admin/{args.resource}"
    action = args.action or "list"
    if action == "list":
        return "GET", base, None, {}
    if action == "remove":
        return "DELETE", f"{base}/{args.name}", None, {}
    if args.resource == "model-groups":
        targets = [dict(zip(("channel", "model"), t.split("=", 1), strict=True)) for t in args.target if "=" in t]
        if len(targets) != len(args.target):
            raise SystemExit("tidegate admin: --target is CHANNEL=MODEL")
        return "PUT", f"{base}/{args.name}", {"targets": targets, "fallbacks": args.fallback}, {}
    body: dict[str, Any] = {} if action == "update" else {"name": args.name}
    for flag in ("base_url", "kind", "api_version", "weight", "priority", "max_concurrency", "stream_upstream",
                 "embeddings"):
        if getattr(args, flag) is not None:
            body[flag] = getattr(args, flag)
    if args.models is not None:
        pairs = [m.split("=", 1) for m in args.models.split(",") if m]
        body["models"] = {p[0]: p[-1] for p in pairs}
    if args.health_path is not None:
        body["health_path"] = None if args.health_path == "none" else args.health_path
    if args.api_key_file is not None:
        body["api_key"] = args.api_key_file.read_text().strip()
    return ("POST", base, body, {}) if action == "add" else ("PATCH", f"{base}/{args.name}", body, {})
