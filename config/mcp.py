"""MCP servers the gateway federates on /mcp: where each is, how it is reached, who may use it."""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, model_validator

# a server's name prefixes its tools' public names (`server__tool`), so it holds no '_' (nor the separator)
SERVER_NAME = r"^[A-Za-z0-9][A-Za-z0-9-]{0,47}$"


class McpTimeouts(BaseModel):
    """Deadlines in seconds for one tool call; each layer is measured on its own."""

    model_config = ConfigDict(extra="forbid")

    connect: float = Field(default=2.0, gt=0)  # to open the MCP session (TCP, TLS, initialize)
    call: float = Field(default=30.0, gt=0)  # from the tools/call sent to its result
    list: float = Field(default=5.0, gt=0)  # a tools/list, which every /mcp client's listing waits on

    @model_validator(mode="after")
    def _call_is_outermost(self) -> McpTimeouts:
        if self.connect > self.call:
            raise ValueError(f"timeouts.connect ({self.connect}) exceeds timeouts.call ({self.call})")
        return self


class McpServer(BaseModel):
    """One upstream MCP server spoken to over streamable HTTP."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=SERVER_NAME)
    url: str = Field(pattern=r"^https?://")
    # sent as `Authorization: Bearer ...`; write-only through the admin API, like a channel's api_key
    api_key: str | None = Field(default=None, repr=False)
    api_key_file: Path | None = None  # config files only, read at start (config.secret_files)
    timeouts: McpTimeouts = Field(default_factory=McpTimeouts)
    # account ids whose keys may see this server's tools; None: every account (keys' allowlists still apply)
    allowed_accounts: list[str] | None = None
    # charged per call into the money ledger, in the gateway's currency; None: calls are free
    price_per_call: float | None = Field(default=None, ge=0)
    max_argument_bytes: int = Field(default=64 * 1024, ge=16)  # a call's arguments as JSON
    max_result_bytes: int = Field(default=1024 * 1024, ge=64)  # a result's content as JSON
    # accounts that opted in to their calls' arguments being written to the gateway's audit log
    log_arguments_for: list[str] = Field(default_factory=list)
    tools_ttl: float = Field(default=30.0, ge=0)  # how long a server's tool list is reused before it is asked again

    @model_validator(mode="after")
    def _one_key(self) -> McpServer:
        if self.api_key_file is not None and self.api_key is not None:
            raise ValueError("set api_key or api_key_file, not both")
        return self
