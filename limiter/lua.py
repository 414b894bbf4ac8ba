"""Loads the Lua sources that live next to this module and joins library files with an entry script."""

from __future__ import annotations

from functools import cache
from importlib import resources

# Library files define local functions; an entry script is appended after the libraries it calls.
LIBRARIES = ("clock", "sliding_window", "fixed_window", "leases", "token_bucket")


@cache
def read_lua(package: str, name: str) -> str:
    return resources.files(package).joinpath(f"{name}.lua").read_text()


def libraries() -> str:
    """Every limiter library, ready to have an entry script appended."""
    return "\n".join(read_lua("limiter", lib) for lib in LIBRARIES)


def compose(package: str, entry: str) -> str:
    """The full text of script `entry` of `package`, preceded by every limiter library."""
    return libraries() + "\n" + read_lua(package, entry)
