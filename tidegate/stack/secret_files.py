"""Secrets kept in files readable by their owner only: the admin key and `tidegate up`'s bootstrap API key.

`tidegate admin-key --file PATH` creates an admin key once (docker-compose's init service runs it) and prints it
only when asked, so no log holds it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from config.secret_files import new_token, secret_file, write_secret

ADMIN_KEY_PREFIX = "tg-admin-"
__all__ = ["ADMIN_KEY_PREFIX", "add_arguments", "main", "new_admin_key", "secret_file", "write_secret"]


def new_admin_key() -> str:
    return new_token(ADMIN_KEY_PREFIX)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--file", type=Path, required=True, help="where the admin key is kept (created 0600)")
    parser.add_argument("--show", action="store_true", help="print the key (by default only its file is named)")
    parser.add_argument("--prefix", default=ADMIN_KEY_PREFIX,
                        help="the secret's prefix (tg-backend- for the backends' gateway token, tg-metrics- for "
                        "the metrics token)")


def main(args: argparse.Namespace) -> int:
    path = args.file.expanduser()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key, created = secret_file(path, new_token(args.prefix))
    if args.show:
        print(key)
    else:
        print(f"admin key {'created' if created else 'kept'} in {path}", file=sys.stderr)
    return 0
