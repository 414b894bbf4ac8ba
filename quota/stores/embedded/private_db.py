"""The embedded store's SQLite file, readable by its owner only: it holds channel api keys and conversations.

The data dir is created 0700 and the database 0600 before SQLite opens it; SQLite gives its -wal and -shm files
the database's mode, and files left by an older version are narrowed too. A data dir others can read (one made
before, or chosen by the operator) is logged as a warning at start rather than changed behind their back.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import stat
from pathlib import Path

log = logging.getLogger("tidegate.store")
SIDE_FILES = ("-wal", "-shm", "-journal")
_warned: set[Path] = set()


def connect_private(path: Path) -> sqlite3.Connection:
    """A WAL connection to `path`, with the directory and every file of the database private to this user."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    _warn_if_open(path.parent)
    os.close(os.open(path, os.O_RDWR | os.O_CREAT, 0o600))  # 0600 from the first byte, whatever the umask
    for file in (path, *(path.with_name(path.name + suffix) for suffix in SIDE_FILES)):
        if file.exists() and stat.S_IMODE(file.stat().st_mode) & 0o077:
            file.chmod(0o600)
    db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    return db


def _warn_if_open(directory: Path) -> None:
    mode = stat.S_IMODE(directory.stat().st_mode)
    if mode & 0o077 and directory not in _warned:
        _warned.add(directory)
        log.warning("the data dir %s is mode %o: others may list it; chmod 700 it (the database itself is 0600)",
                    directory, mode)
