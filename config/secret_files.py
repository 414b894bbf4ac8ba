"""Secrets kept in files readable by their owner only, created once: the admin key, the tenant salt's secret,
the backend token and the metrics token, where an operator did not set their own."""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from config.gateway import GatewaySettings
from config.settings import SettingsError

METRICS_TOKEN_FILE = "metrics_token"  # in the data dir, when no metrics token is configured


def new_token(prefix: str = "") -> str:
    return prefix + secrets.token_urlsafe(32)


def write_secret(path: Path, secret: str) -> None:
    """Writes `secret` to `path` with mode 0600 from the first byte (never readable by others, even briefly)."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(secret + "\n")
    path.chmod(0o600)


def secret_file(path: Path, make: str) -> tuple[str, bool]:
    """The secret kept in `path`, and whether it was created now (from `make`)."""
    if not path.exists():
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        written = path.with_name(f".{path.name}.{os.getpid()}")
        write_secret(written, make)
        try:
            os.link(written, path)  # all or nothing: of two first starts, one secret wins and both read it
            return make, True
        except FileExistsError:
            pass
        finally:
            written.unlink()
    return path.read_text().strip(), False


def read_secret(path: Path, what: str) -> str:
    """The secret in `path`; a missing or empty file is a start-up error that names the file, not the secret."""
    try:
        secret = path.expanduser().read_text().strip()
    except OSError as exc:
        raise SettingsError(f"cannot read {what} file {path}: {exc.strerror}") from None
    if not secret:
        raise SettingsError(f"the {what} file {path} is empty")
    return secret


def with_channel_keys(settings: GatewaySettings) -> GatewaySettings:
    """The settings with each channel's and MCP server's `api_key_file` read into its `api_key` (once, at start)."""
    channels = [c if c.api_key_file is None else c.model_copy(update={
        "api_key": read_secret(c.api_key_file, f"channels.{c.name}.api_key_file"), "api_key_file": None})
        for c in settings.channels]
    servers = [s if s.api_key_file is None else s.model_copy(update={
        "api_key": read_secret(s.api_key_file, f"mcp_servers.{s.name}.api_key_file"), "api_key_file": None})
        for s in settings.mcp_servers]
    return settings.model_copy(update={"channels": channels, "mcp_servers": servers})


def with_metrics_token(settings: GatewaySettings, generate: bool) -> GatewaySettings:
    """The settings with `metrics_token` resolved: the configured one, the file's, or (`generate`, and /metrics
    not declared public) one created once in the data dir."""
    token = settings.metrics_token
    if token is None and settings.metrics_token_file is not None:
        token = read_secret(settings.metrics_token_file, "metrics_token")
    elif token is None and generate and not settings.metrics_public:
        token = secret_file(settings.resolved_data_dir() / METRICS_TOKEN_FILE, new_token("tg-metrics-"))[0]
    return settings.model_copy(update={"metrics_token": token, "metrics_token_file": None})
