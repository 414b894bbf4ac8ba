"""Typed readers of one JSON body's fields: each returns the value or raises a 400 that names the field."""

from __future__ import annotations

import json
from typing import Any

from backend.server.api_errors import invalid


def int_field(body: dict[str, Any], name: str, lo: int | None = None, hi: int | None = None) -> int | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # JSON writers often send 16.0 for 16
    if not isinstance(value, int) or isinstance(value, bool):
        raise invalid(f"`{name}` must be an integer, got {json.dumps(value)[:40]}", name)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise invalid(f"`{name}` must be {_range(lo, hi)}, got {value}", name)
    return value


def float_field(body: dict[str, Any], name: str, lo: float, hi: float) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise invalid(f"`{name}` must be a number, got {json.dumps(value)[:40]}", name)
    if not lo <= value <= hi:
        raise invalid(f"`{name}` must be between {lo:g} and {hi:g}, got {value}", name)
    return float(value)


def bool_field(body: dict[str, Any], name: str) -> bool:
    value = body.get(name)
    if value is None:
        return False
    if not isinstance(value, bool):
        raise invalid(f"`{name}` must be a boolean, got {json.dumps(value)[:40]}", name)
    return value


def str_or_none(body: dict[str, Any], name: str) -> str | None:
    value = body.get(name)
    if value is not None and not isinstance(value, str):
        raise invalid(f"`{name}` must be a string", name)
    return value


def int_list(value: Any, name: str) -> list[int]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise invalid(f"`{name}` must be a list of integers", name)
    return list(value)


def utf8(text: str, param: str) -> str:
    # json.loads turns "\ud800" into a lone surrogate that no tokenizer can encode.
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise invalid(f"`{param}` holds an invalid Unicode escape (a lone surrogate)", param) from None
    return text


def _range(lo: int | None, hi: int | None) -> str:
    if lo is not None and hi is not None:
        return f"between {lo} and {hi}"
    return f">= {lo}" if lo is not None else f"<= {hi}"
