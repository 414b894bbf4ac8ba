"""Secrets kept in files readable by their owner only: the admin key and `tidegate up`'s bootstrap API key.

`tidegate admin-key --file PATH` creates an admin key once (docker-compose's init service runs it) and prints it
only when asked, so no log holds it.
"""

from __future__ import annotations

import argparse
import os
import secrets
import sys
from pathlib import Path

ADMIN_KEY_PREFIX = "tg-admin-"


def new_admin_key() -> str:
    return ADMIN_KEY_PREFIX + secrets.token_urlsafe(32)


def write_secret(path: Path, secret: str) -> None:
    """Writes `secret` to `path` with mode 0600 from the first byte (never readable by others, even briefly)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(secret + "\n")
    path.chmod(0o600)


def secret_file(path: Path, make: str) -> tuple[str, bool]:
    """The secret kept in `path`, and whether it was created now (from `make`)."""
    if path.exists():
        return path.read_text().strip(), False
    write_secret(path, make)
    return make, True


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--file", type=Path, required=True, help="where the admin key is kept (created 0600)")
    parser.add_argument("--show", action="store_true", help="print the key (by default only its file is named)")


def main(args: argparse.Namespace) -> int:
    path = args.file.expanduser()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    key, created = secret_file(path, new_admin_key())
    if args.show:
        print(key)
    else:
        print(f"admin key {'created' if created else 'kept'} in {path}", file=sys.stderr)
    return 0
