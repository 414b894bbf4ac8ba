"""The `tidegate` command: one entry point for every tier.

Flags map onto the settings in `config/` and override the YAML file and `TIDEGATE_*` variables.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from config import Settings, SettingsError, load_settings

# subcommand -> (module that implements it, what the user is told when that tier is missing)
TIERS = {
    "up": ("tidegate.up", "the local stack"),
    "backend": ("backend.server.app", "the backend server"),
    "gateway": ("gateway.server", "the gateway"),
    "admin": ("gateway.admin_cli", "the admin client"),
    "bench": ("bench.cli", "the load generator"),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tidegate", description="LLM serving gateway and inference backend")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    up = sub.add_parser("up", help="start backend replicas and a gateway on this machine")
    up.add_argument("--replicas", type=int, default=1, help="backend replicas (default 1)")
    up.add_argument("--port", type=int, default=8000, help="gateway port (default 8000)")
    up.add_argument("--host", default="127.0.0.1")
    up.add_argument("--redis", metavar="URL", help="use Redis instead of the embedded store")
    up.add_argument("--model", default="smollm2", help="model for the replicas (default smollm2)")
    up.add_argument("--backend-port", type=int, default=9001, help="first replica's port")
    up.add_argument("--data-dir", type=Path, help="where the embedded store keeps its SQLite file")

    be = sub.add_parser("backend", help="serve one inference replica over the OpenAI API")
    be.add_argument("--config", type=Path, help="YAML file of backend settings")
    be.add_argument("--model", help="path to a .gguf file or HF folder, or a named model (smollm2)")
    be.add_argument("--served-model-name")
    be.add_argument("--host")
    be.add_argument("--port", type=int)
    be.add_argument("--device", choices=["cpu", "cuda"])
    be.add_argument("--dtype", choices=["auto", "float32", "float16", "bfloat16"])
    be.add_argument("--max-num-seqs", type=int)
    be.add_argument("--max-num-batched-tokens", type=int)
    be.add_argument("--max-model-len", type=int)
    be.add_argument("--block-size", type=int)
    be.add_argument("--kv-cache-memory", help="KV pool size, e.g. 512MiB")
    be.add_argument("--max-waiting", type=int, help="bound of the waiting queue")
    be.add_argument("--queue-timeout", type=float, help="seconds a request may wait to start")
    be.add_argument("--threads", type=int, help="torch CPU threads")
    be.add_argument("--max-waiting-tokens", type=int, help="bound of the waiting queue in prompt tokens")
    be.add_argument("--max-body-bytes", type=int, help="largest request body accepted (413 beyond)")
    be.add_argument("--no-prefix-caching", dest="enable_prefix_caching", action="store_false", default=None,
                    help="turn the prefix cache off")
    be.add_argument("--log-level", choices=["debug", "info", "warning", "error"])

    gw = sub.add_parser("gateway", help="serve one gateway replica")
    gw.add_argument("--config", type=Path, help="YAML file of gateway settings (channels, classes, ...)")
    gw.add_argument("--host")
    gw.add_argument("--port", type=int)
    gw.add_argument("--redis", dest="redis_url", metavar="URL")
    gw.add_argument("--workers", type=int)
    gw.add_argument("--admin-key")
    gw.add_argument("--data-dir", type=Path)
    gw.add_argument("--log-level", choices=["debug", "info", "warning", "error"])

    admin = sub.add_parser("admin", help="accounts, sub-accounts, keys, quotas and usage over the admin API")
    _delegate_arguments(admin, "admin")

    bench = sub.add_parser("bench", help="load generator and capacity planner")
    _delegate_arguments(bench, "bench")

    model = sub.add_parser("model", help="the local model cache")
    model_sub = model.add_subparsers(dest="model_command", metavar="ACTION", required=True)
    pull = model_sub.add_parser("pull", help="fetch a named model into the cache and print its path")
    pull.add_argument("name", nargs="?", default="smollm2")
    return parser


def _delegate_arguments(parser: argparse.ArgumentParser, command: str) -> None:
    """Tiers that own many flags (bench, admin) declare them next to their code."""
    module = TIERS[command][0]
    if importlib.util.find_spec(module) is not None:
        importlib.import_module(module).add_arguments(parser)
    else:
        parser.add_argument("rest", nargs=argparse.REMAINDER)


def settings_from_args(args: argparse.Namespace, section: str, fields: Sequence[str]) -> Settings:
    overrides: dict[str, Any] = {}
    for name in fields:
        value = getattr(args, name, None)
        if value is not None:
            overrides[name] = value
    return load_settings(getattr(args, "config", None), section=section, overrides={section: overrides})


BACKEND_FLAGS = ("model", "served_model_name", "host", "port", "device", "dtype", "max_num_seqs",
                 "max_num_batched_tokens", "max_model_len", "block_size", "kv_cache_memory", "max_waiting",
                 "queue_timeout", "threads", "max_waiting_tokens", "max_body_bytes", "enable_prefix_caching",
                 "log_level")
GATEWAY_FLAGS = ("host", "port", "redis_url", "workers", "admin_key", "data_dir", "log_level")


def _run_tier(command: str) -> Callable[[argparse.Namespace], int]:
    module_name, what = TIERS[command]
    if importlib.util.find_spec(module_name) is None:
        print(f"tidegate {command}: {what} is not built yet", file=sys.stderr)
        raise SystemExit(2)
    return importlib.import_module(module_name).main


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
        if args.command == "backend":
            args.settings = settings_from_args(args, "backend", BACKEND_FLAGS)
        elif args.command == "gateway":
            args.settings = settings_from_args(args, "gateway", GATEWAY_FLAGS)
        else:
            args.settings = load_settings()
        return int(_run_tier(args.command)(args) or 0)
    except SettingsError as exc:
        print(f"tidegate {args.command}: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
