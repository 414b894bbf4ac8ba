"""What the admin routes of records that hold an upstream's api_key (channels, MCP servers) share: a named record's
lookup, a body's validation without echoing the key, the key dropped when the URL moves, and views without it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from gateway.errors import invalid_request, not_found

M = TypeVar("M", bound=BaseModel)
T = TypeVar("T")


def named(records: Mapping[str, T], request: Request, noun: str, code: str) -> T:
    """The record the path names, or a 404 `code` saying there is no such `noun`."""
    name = request.path_params["name"]
    record = records.get(name)
    if record is None:
        raise not_found(f"no {noun} {name!r}", code)
    return record


def validated_record(kind: type[M], body: dict[str, Any]) -> M:
    if body.get("api_key_file") is not None:  # a path on the gateway's disk: its content would go upstream
        raise invalid_request("api_key_file: for config files only; send api_key")
    try:
        return kind.model_validate(body)
    except ValidationError as exc:
        # locations and reasons only: pydantic's own text would echo the input, an api_key included
        reasons = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'body'}: {e['msg']}" for e in exc.errors())
        raise invalid_request(reasons) from None


def refuse_rename(changes: dict[str, Any], name: str, noun: str) -> None:
    if changes.get("name", name) != name:
        raise invalid_request(f"{noun} cannot be renamed: add the new one, then remove this one", "name")


def updated_record(kind: type[M], record: dict[str, Any], changes: dict[str, Any], url_field: str) -> M:
    """The stored record with the changes applied, validated."""
    if changes.get(url_field, record[url_field]) != record[url_field] and "api_key" not in changes:
        record = {**record, "api_key": None}  # a stored key is never sent to a destination it was not set for
    return validated_record(kind, {**record, **changes})


def key_hidden(config: BaseModel, *also: str) -> dict[str, Any]:
    """The settings without the api_key (nor the fields `also` names), and whether a key is set."""
    return {**config.model_dump(mode="json", exclude={"api_key", *also}),
            "api_key_set": getattr(config, "api_key", None) is not None}
