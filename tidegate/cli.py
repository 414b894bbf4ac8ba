"""The `tidegate` command: one entry point for every tier.

Flags map onto the settings in `config/` and override the YAML file and `TIDEGATE_*` variables.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from config import AutoscaleSettings, BackendSettings, Settings, SettingsError, load_settings
from tidegate import cpu_wait
from tidegate.settings_flags import add_settings_flags
from tidegate.stack.autoscale import ReplicaRange, parse_replicas, parse_schedule, schedule_problem

# subcommand -> the module that implements it (imported only when run, so each pays for its own imports)
TIERS = {
    "up": "tidegate.stack.up",
    "backend": "backend.server.app",
    "gateway": "gateway.server",
    "admin": "tidegate.admin.cli",
    "admin-key": "tidegate.stack.secret_files",
    "bench": "bench.cli",
}
GATEWAY_FLAGS = ("host", "port", "redis_url", "workers", "admin_key", "admin_key_file", "data_dir", "log_level")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tidegate", description="LLM serving gateway and inference backend")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    up = sub.add_parser("up", help="start backend replicas and a gateway on this machine")
    up.add_argument("--replicas", type=_checked(parse_replicas), default=ReplicaRange(1, 1), metavar="N|MIN:MAX",
                    help="backend replicas: N, or MIN:MAX to autoscale between them on load (default 1)")
    up.add_argument("--schedule", type=_checked(parse_schedule), default=(), metavar="HH:MM-HH:MM=N,...",
                    help="with MIN:MAX: at least N replicas in each window of local time, for predictable peaks")
    up.add_argument("--port", type=int, default=8000, help="gateway port (default 8000)")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--redis", metavar="URL", help="use Redis instead of the embedded store")
    up.add_argument("--model", default="smollm2", help="model for the replicas (default smollm2)")
    up.add_argument("--backend-port", type=int, default=9001, help="first replica's port")
    up.add_argument("--data-dir", type=Path, help="where the embedded store keeps its SQLite file")
    up.add_argument("--show-keys", action=argparse.BooleanOptionalAction, default=None,
                    help="print the admin and API keys (default: only when they are created; --no-show-keys "
                         "never prints them, only the files that hold them)")
    up.set_defaults(setting_fields=add_settings_flags(up, AutoscaleSettings))

    be = sub.add_parser("backend", help="serve one inference replica over the OpenAI API")
    be.add_argument("--config", type=Path, help="YAML file of backend settings")
    be.set_defaults(setting_fields=add_settings_flags(be, BackendSettings))

    gw = sub.add_parser("gateway", help="serve one gateway replica")
    gw.add_argument("--config", type=Path, help="YAML file of gateway settings (channels, classes, ...)")
    gw.add_argument("--host")
    gw.add_argument("--port", type=int)
    gw.add_argument("--redis", dest="redis_url", metavar="URL")
    gw.add_argument("--workers", type=int)
    gw.add_argument("--admin-key", help="the admin key (shown in process listings: prefer --admin-key-file)")
    gw.add_argument("--admin-key-file", type=Path, help="a file holding the admin key")
    gw.add_argument("--data-dir", type=Path)
    gw.add_argument("--log-level", choices=["debug", "info", "warning", "error"])
    gw.set_defaults(setting_fields=GATEWAY_FLAGS)

    admin = sub.add_parser("admin", help="accounts, sub-accounts, keys, quotas and usage over the admin API")
    _delegate_arguments(admin, "admin")

    admin_key = sub.add_parser("admin-key", help="create the gateway's admin key in a file (0600), once")
    _delegate_arguments(admin_key, "admin-key")

    bench = sub.add_parser("bench", help="load generator and capacity planner")
    _delegate_arguments(bench, "bench")

    model = sub.add_parser("model", help="the local model cache")
    model_sub = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    pull = model_sub.add_parser("pull", help="fetch a named model into the cache and print its path")
    pull.add_argument("name", nargs="?", default="smollm2")
    return parser


def _checked(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """A parser whose ValueError argparse prints as it is (it hides any other message behind the type's name)."""
    def checked(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return checked


def _delegate_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Tiers that own many flags (bench, admin) declare them next to their code."""
    importlib.import_module(TIERS[command]).add_arguments(parser)


def settings_from_args(args: argparse.Namespace, section: str, fields: Sequence[str]) -> Settings:
    overrides: dict[str, Any] = {}
    for name in fields:
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    return load_settings(getattr(args, "config", None), section=section, overrides={section: overrides})


def _run_tier(command: str) -> Callable[[argparse.Namespace], int]:
    return importlib.import_module(TIERS[command]).main


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "model":
            from backend.loading.model_cache import ModelCacheError, pull

            try:
                print(pull(args.name, load_settings().resolved_model_dir()))
            except ModelCacheError as exc:
                print(f"tidegate model pull: {exc}", file=sys.stderr)
                return 1
            return 0
        if args.command in ("backend", "gateway"):
            args.settings = settings_from_args(args, args.command, args.setting_fields)
            if args.command == "backend":  # before torch loads libgomp, which reads its wait policy once
                backend = args.settings.backend
                args.cpu_wait = cpu_wait.apply(backend.cpu_wait, backend.threads)
        elif args.command == "up":
            args.settings = settings_from_args(args, "autoscale", args.setting_fields)
            problem = args.schedule and schedule_problem(args.replicas, args.schedule)
            if problem:
                print(f"tidegate up: {problem}", file=sys.stderr)
                return 2
        else:
            args.settings = load_settings()
        return int(_run_tier(args.command)(args) or 0)
    except SettingsError as exc:
        print(f"tidegate {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
