"""A tool's public names: `server__tool` on /mcp, `mcp:server__tool` in allowlists, quotas, usage and prices."""

from __future__ import annotations

from config.mcp import McpServer
from quota import KeyInfo

SEPARATOR = "__"  # a server's name holds no '_', so the first separator ends it
PREFIX = "mcp:"


def public_name(server: str, tool: str) -> str:
    return f"{server}{SEPARATOR}{tool}"


def split_name(name: str) -> tuple[str, str] | None:
    """(server, tool) of a public name; None when it is not one."""
    server, separator, tool = name.partition(SEPARATOR)
    return (server, tool) if separator and server and tool else None


def model_name(server: str, tool: str) -> str:
    """The name a call is admitted, charged and reported under."""
    return f"{PREFIX}{public_name(server, tool)}"


def every_tool(server: str) -> str:
    """The allowlist entry (and price name) that covers each of a server's tools."""
    return f"{PREFIX}{server}{SEPARATOR}*"


def may_use(key: KeyInfo, server: McpServer, tool: str) -> bool:
    """The server admits the key's account, and the key's (and its account's) allowlist names the tool."""
    if server.allowed_accounts is not None and key.account_id not in server.allowed_accounts:
        return False
    return key.allows(model_name(server.name, tool))
