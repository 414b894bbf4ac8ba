"""Tool names and allowlists: `server__tool` splits at the first separator, and `mcp:server__*` allows every tool
of one server, in a key's list and in its account's, which bounds the key's."""

from __future__ import annotations

from config.mcp import McpServer
from gateway.mcp.names import every_tool, may_use, model_name, split_name
from quota import Account, ApiKey, KeyInfo

SEARCH = McpServer(name="search", url="http://127.0.0.1:1/mcp")


def key(models: list[str] | None, account_models: list[str] | None = None) -> KeyInfo:
    return KeyInfo.of(ApiKey("k", "acct", models=models), Account("acct", "acme", models=account_models))


def test_public_names_split_at_the_first_separator() -> None:
    assert split_name("search__web__fetch") == ("search", "web__fetch")
    assert split_name("search__") is None and split_name("__x") is None and split_name("plain") is None
    assert model_name("search", "query") == "mcp:search__query" and every_tool("search") == "mcp:search__*"


def test_a_server_wildcard_allows_its_tools_and_no_others() -> None:
    assert may_use(key(["mcp:search__*"]), SEARCH, "query")
    assert not may_use(key(["mcp:other__*", "mcp:search__fetch"]), SEARCH, "query")
    assert may_use(key(None), SEARCH, "query")  # no list: every tool of the servers the account may see
    assert not key(["mcp:search__*"]).allows("smollm2")
    assert not key(["mcp:search__*"]).allows("mcp:searchx__query")


def test_an_accounts_list_bounds_its_keys_wildcards_included() -> None:
    assert may_use(key(["mcp:search__query"], ["mcp:search__*"]), SEARCH, "query")
    assert not may_use(key(["mcp:search__*"], ["mcp:search__fetch"]), SEARCH, "query")
    assert may_use(key(None, ["mcp:search__*"]), SEARCH, "fetch")


def test_a_server_for_some_accounts_refuses_the_others_keys() -> None:
    only_other = SEARCH.model_copy(update={"allowed_accounts": ["someone-else"]})
    assert not may_use(key(None), only_other, "query")
    assert may_use(key(None), only_other.model_copy(update={"allowed_accounts": ["acct"]}), "query")
