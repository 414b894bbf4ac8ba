"""How the settings, secrets included, reach `--workers N` processes: a private file, never the environment.

A process's environment is readable by every tool that lists processes of the same user (`/proc/PID/environ`,
`ps e`) and is copied into every child, so the admin key and the channels' API keys travel instead in a file
only this user can read, in a directory only this user can enter. The file lives as long as the server: uvicorn
starts a replacement for a worker that dies, and the replacement reads it again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from config import GatewaySettings

SETTINGS_FILE_ENV = "TIDEGATE_GATEWAY_SETTINGS_FILE"  # holds a path, never a secret
# variables that may carry secrets the settings were built from; workers need none of them
SECRET_ENV_PREFIXES = ("TIDEGATE_GATEWAY__", "TIDEGATE_ADMIN_KEY")


@contextlib.contextmanager
def settings_for_workers(settings: GatewaySettings) -> Iterator[Path]:
    """Writes the settings where workers find them, drops secret-bearing variables from the environment the
    workers inherit, and removes the file when the server stops."""
    folder = Path(tempfile.mkdtemp(prefix="tidegate-gateway-"))  # mode 0700
    path = folder / "settings.json"
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(settings.model_dump_json())
    for name in [n for n in os.environ if n.startswith(SECRET_ENV_PREFIXES)]:
        del os.environ[name]
    os.environ[SETTINGS_FILE_ENV] = str(path)
    try:
        yield path
    finally:
        os.environ.pop(SETTINGS_FILE_ENV, None)
        shutil.rmtree(folder, ignore_errors=True)


def read_worker_settings() -> GatewaySettings:
    """In a worker: the settings its server wrote for it."""
    path = os.environ.get(SETTINGS_FILE_ENV)
    if path is None:
        raise RuntimeError(f"{SETTINGS_FILE_ENV} is not set; start workers with `tidegate gateway`")
    return GatewaySettings.model_validate_json(Path(path).read_text())
